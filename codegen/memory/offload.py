"""Saved activations offloaded to host memory: which buffers move, and where in the schedule.

The forward copies an offloaded output to pinned host memory on a side stream right after the
item that makes it and frees the device copy once the copy is estimated done and its last
forward reader ran; the backward copies it back on another side stream, started just early
enough (estimated) that the copy is done before its first reader. Estimates come from a rough
time per schedule item (`item_seconds`) and the host link's bandwidth: they only place those
events, and the memory plan then counts exactly what the wrapper does at them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from trainc.codegen.graph import CallNode, LoweredGraph, TensorArg
from trainc.codegen.scheduler import Kernel, Schedule, _call_buffers
from trainc.graph import is_dense

aten = torch.ops.aten

# Values smaller than this are never offloaded: each offload costs host time (a pinned
# allocation, stream waits) that only pays for itself on large tensors.
MIN_BYTES = 1 << 20
# Rough device rates for placing copies (H100/H200 class, effective rather than peak): memory
# bandwidth for kernels and ATen calls, matmul/convolution/attention rate per dtype width.
MEMORY_BYTES_PER_S = 3.0e12
FLOPS_PER_S = {2: 5.0e14, 4: 5.0e13, 8: 2.5e13}
# A backward copy starts this much earlier than the estimate says it must (estimates are rough;
# a late copy stalls the step, an early one only holds its memory a little longer).
LOAD_MARGIN = 1.5

_MATMULS = {aten.mm.default: "mm", aten.addmm.default: "addmm", aten.bmm.default: "bmm"}


@dataclass(frozen=True)
class Offload:
    """save: forward buffers copied to host after the item making them, each with the first
    item after which its device copy may be freed; load: backward input buffers that arrive on
    the host, each with the item before which its copy back starts, and its first reader;
    inner: buffers of one graph (compile_step's) moved out and back within it: (buffer, the
    item after which its device copy is freed, the item before which its copy back starts,
    its first reader after that)."""
    save: tuple[tuple[str, int], ...] = ()
    load: tuple[tuple[str, int, int], ...] = ()
    inner: tuple[tuple[str, int, int, int], ...] = ()
    stall_seconds: float = 0.0  # estimated time the backward waits for its copies
    late: int = 0  # forward copies estimated to end after the forward does
    span_seconds: float = 0.0  # the graph's estimated time (offload.item_seconds)

    @property
    def saves(self) -> dict[str, int]:
        return dict(self.save)

    @property
    def loads(self) -> dict[str, tuple[int, int]]:
        return {b: (p, u) for b, p, u in self.load}

    @property
    def inners(self) -> dict[str, tuple[int, int, int]]:
        return {b: (f, p, u) for b, f, p, u in self.inner}

    def __bool__(self) -> bool:
        return bool(self.save or self.load or self.inner)

    def __str__(self) -> str:
        lines = [f"offload: {len(self.save)} saved to host, {len(self.load)} loaded back; "
                 f"estimated stall {self.stall_seconds * 1e3:.3f} ms, {self.late} late"]
        lines += [f"  save {b} (device copy freed from item {k})" for b, k in self.save]
        lines += [f"  load {b} (copy starts before item {p}, first read by item {u})"
                  for b, p, u in self.load]
        lines += [f"  move {b} (device copy freed after item {f}, copy back before item {p}, "
                  f"read again by item {u})" for b, f, p, u in self.inner]
        return "\n".join(lines)


def saveable_outputs(g: LoweredGraph, first: int) -> list[int]:
    """Output positions from `first` on whose buffer can move to host: a whole buffer (or a
    view of all of it) the wrapper makes (not an input or a constant, nor in an input's
    storage, nor a fallback op's result, which may be a view of another buffer: freeing it
    would free nothing), output once, at least MIN_BYTES."""
    outs = [a for a in g.outputs if isinstance(a, TensorArg)]
    count: dict[str, int] = {}
    for a in outs:
        count[a.buf] = count.get(a.buf, 0) + 1
    taken = set(g.storage.values()) | _fallback_results(g)
    out = []
    for j, a in enumerate(g.outputs):
        if j < first or not isinstance(a, TensorArg) or count[a.buf] > 1:
            continue
        b = g.buffers[a.buf]
        if covers(a, b) and b.kind in ("compute", "call") and not _in_input(g, a.buf) and \
                a.buf not in taken and b.nbytes >= MIN_BYTES:
            out.append(j)
    return out


def covers(a: TensorArg, b) -> bool:
    """The output reads all of its dense buffer (the buffer itself, or a reshaped or permuted
    view of it: q/k/v projections as heads), so its host copy is the buffer's, viewed alike."""
    return a.whole or (a.offset == 0 and _numel(a.shape) == _numel(b.shape) and
                       is_dense(a.shape, a.stride) and is_dense(b.shape, b.stride))


def _fallback_results(g: LoweredGraph) -> set[str]:
    return {o for s in g.steps if isinstance(s, CallNode) and s.kind == "fallback"
            for o in s.outputs if o is not None}


def _in_input(g: LoweredGraph, b: str) -> bool:
    """b lives in the storage of a graph input (an in-place chain back to one)."""
    seen = set()
    while b in g.storage and b not in seen:
        seen.add(b)
        b = g.storage[b]
    return b in g.inputs or g.buffers[b].kind in ("input", "const")


def item_seconds(sched: Schedule, params: dict[str, list[str]]) -> list[float]:
    """A rough time per schedule item: the larger of its bytes over memory bandwidth and its
    matmul/convolution/attention FLOPs over the device's rate."""
    g = sched.graph
    out = []
    for item in sched.items:
        if isinstance(item, Kernel):
            names = list(params.get(item.name, ()))
            names += [n.name for n in item.nodes if n.name not in item.local]
        else:
            names = _call_buffers(item) + [o for o in item.outputs if o is not None]
        nbytes = sum(g.buffers[b].nbytes for b in dict.fromkeys(names) if b in g.buffers)
        flops, width = _flops(item, g) if isinstance(item, CallNode) else (0, 4)
        out.append(max(nbytes / MEMORY_BYTES_PER_S, flops / FLOPS_PER_S.get(width, 5.0e13)))
    return out


def _flops(c: CallNode, g: LoweredGraph) -> tuple[float, int]:
    shapes = [g.buffers[b].shape for b in _call_buffers(c) if b in g.buffers]
    outs = [g.buffers[o] for o in c.outputs if o is not None and o in g.buffers]
    if not outs or not shapes:
        return 0.0, 4
    width = torch.empty((), dtype=outs[0].dtype).element_size()
    numel = _numel(outs[0].shape)
    name = str(c.target)
    if c.target in _MATMULS:
        a = shapes[-2] if c.target is aten.addmm.default else shapes[0]
        return 2.0 * numel * a[-1], width
    if "convolution_backward" in name:
        return 4.0 * _numel(shapes[0]) * _numel(shapes[2][1:]), width
    if "convolution" in name:
        return 2.0 * numel * _numel(shapes[1][1:]), width
    if "scaled_dot_product" in name:
        q, k = shapes[0], shapes[1]
        fwd = 4.0 * _numel(q) * k[-2]
        return (2.5 * fwd if "backward" in name else fwd), width
    return 0.0, width


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _starts(seconds: Sequence[float]) -> list[float]:
    out, t = [], 0.0
    for s in seconds:
        out.append(t)
        t += s
    return out


def plan_saves(sched: Schedule, params: dict[str, list[str]], bufs: Sequence[str],
               bandwidth: float) -> Offload:
    """The forward's offloads of `bufs`: each copy starts when its item is done, one at a time
    on the side stream; the device copy is freed after the item during which the copy is
    estimated to end (never before its last reader: walk.py keeps that). A copy estimated to
    end after the forward (`late`) is freed at its end in the plan, though the allocator frees
    it only when the copy ends: the plan under-counts then, so a budget never chooses such."""
    secs = item_seconds(sched, params)
    starts = _starts(secs)
    end_of = len(secs) - 1
    made = _made_at(sched)
    stream, save, late = 0.0, [], 0
    for b in sorted(bufs, key=lambda b: made[b]):
        k = made[b]
        begin = max(starts[k] + secs[k], stream)
        stream = begin + sched.graph.buffers[b].nbytes / bandwidth
        done = next((i for i in range(k, len(secs)) if starts[i] + secs[i] >= stream), None)
        late += done is None
        save.append((b, end_of if done is None else done))
    return Offload(save=tuple(save), late=late, span_seconds=sum(secs))


def plan_loads(sched: Schedule, params: dict[str, list[str]], bufs: Sequence[str],
               bandwidth: float) -> Offload:
    """The backward's loads of `bufs` (inputs arriving on the host): copies in first-use order
    on one side stream, each started LOAD_MARGIN times its estimated length before it must end
    (the next copy's start, or its first reader's), as late as that allows; the stall is what
    the step would wait for them as estimated."""
    secs = item_seconds(sched, params)
    reads = _all_reads(sched, params)
    uses = {b: reads[b][0] if b in reads else len(secs) - 1 for b in bufs}
    issue, stall = _issue(_starts(secs), [(b, uses[b], sched.graph.buffers[b].nbytes /
                                           bandwidth, 0) for b in bufs])
    load = tuple((b, issue[b], uses[b]) for b in sorted(bufs, key=lambda b: uses[b]))
    return Offload(load=load, stall_seconds=stall, span_seconds=sum(secs))


def _made_at(sched: Schedule) -> dict[str, int]:
    made = {}
    for k, item in enumerate(sched.items):
        names = [n.name for n in item.nodes] if isinstance(item, Kernel) else \
            [o for o in item.outputs if o is not None]
        for b in names:
            made.setdefault(b, k)
    return made


def output_buffers(g: LoweredGraph, positions: Sequence[int]) -> list[str]:
    return [g.outputs[j].buf for j in positions]


def input_buffers(g: LoweredGraph, positions: Sequence[int]) -> list[str]:
    """The input buffers of placeholder positions (a Python number's placeholder has none)."""
    return [g.params[j] for j in positions
            if j < len(g.params) and g.params[j] in g.buffers and g.params[j] in g.inputs]


def merged(a: Optional[Offload], b: Optional[Offload]) -> Optional[Offload]:
    if not a:
        return b or None
    if not b:
        return a
    return Offload(a.save + b.save, a.load + b.load, a.inner + b.inner,
                   a.stall_seconds + b.stall_seconds, a.late + b.late,
                   max(a.span_seconds, b.span_seconds))


# gm.meta key: an OffloadRequest, what the partition asks the codegen to move (pipeline.py)
OFFLOAD = "trainc_offload"


@dataclass(frozen=True)
class OffloadRequest:
    """outputs: forward output positions to move to host where they can (saveable_outputs);
    inputs: backward placeholder positions that arrive on the host (all must load);
    bandwidth: the host link's bytes per second, for placing the copies."""
    outputs: tuple[int, ...] = ()
    inputs: tuple[int, ...] = ()
    bandwidth: float = 2.5e10
    inner: bool = False  # move the graph's offloadable buffers out and back within it
    names: Optional[tuple[str, ...]] = None  # with inner: only these tags (None: every one)


def plan_offload(req: Optional[OffloadRequest], sched: Schedule,
                 params: dict[str, list[str]]) -> Optional[Offload]:
    """The Offload of one graph for its request (None: nothing moves)."""
    if req is None or not (req.outputs or req.inputs or req.inner):
        return None
    g = sched.graph
    wanted = set(req.outputs)
    saves = output_buffers(g, [j for j in saveable_outputs(g, 0) if j in wanted])
    loads = input_buffers(g, req.inputs)
    if len(loads) != len(set(req.inputs)):
        raise ValueError(f"trainc: offload: backward inputs {sorted(req.inputs)} asked to load "
                         f"from host, but only {len(loads)} of them are tensor inputs")
    out = plan_saves(sched, params, saves, req.bandwidth) if saves else None
    out = merged(out, plan_loads(sched, params, loads, req.bandwidth) if loads else None)
    inner = [b for tag, b in g.offloadable if b in g.buffers and
             (req.names is None or tag in req.names)] if req.inner else []
    return merged(out, plan_inner(sched, params, inner, req.bandwidth) if inner else None)


def plan_inner(sched: Schedule, params: dict[str, list[str]], bufs: Sequence[str],
               bandwidth: float) -> Optional[Offload]:
    """Moves within one graph: each buffer leaves over the longest gap between two of its
    readers (the forward's last and the backward's first in a step) when its copy out is
    estimated done before the gap ends; its copy back starts as plan_loads' would. Graph
    outputs, buffers a later op overwrites and buffers in an input's storage stay."""
    g = sched.graph
    secs = item_seconds(sched, params)
    starts = _starts(secs)
    made = _made_at(sched)
    readers = _all_reads(sched, params)
    outputs = {a.buf for a in g.outputs if isinstance(a, TensorArg)}
    taken = set(g.storage.values()) | _fallback_results(g)  # written again, or maybe a view
    stream, moves = 0.0, []
    for b in sorted(bufs, key=lambda b: made.get(b, 0)):
        if b in outputs or b in taken or _in_input(g, b) or b not in made or \
                g.buffers[b].nbytes < MIN_BYTES:
            continue
        reads = sorted({made[b], *readers.get(b, ())})
        gaps = [(starts[y] - starts[x] - secs[x], x, y) for x, y in zip(reads, reads[1:])]
        if not gaps:
            continue
        _, last, again = max(gaps)
        begin = max(starts[made[b]] + secs[made[b]], stream)
        end = begin + g.buffers[b].nbytes / bandwidth
        done = next((i for i in range(made[b], len(secs)) if starts[i] + secs[i] >= end),
                    len(secs) - 1)
        free = max(last, done)
        if free + 1 >= again:  # nothing runs between the free and the copy back: no gain
            continue
        stream = end
        moves.append((b, free, again))
    if not moves:
        return None
    issue, stall = _issue(starts, [(b, u, g.buffers[b].nbytes / bandwidth, f + 1)
                                   for b, f, u in moves])
    return Offload(inner=tuple((b, f, issue[b], u) for b, f, u in moves),
                   stall_seconds=stall, span_seconds=sum(secs))


def _issue(starts: list[float], loads: list[tuple]) -> tuple[dict, float]:
    """Copy-back issue items on one side stream (plan_loads' rule) for (buffer, first reader,
    copy seconds, earliest item) each; and the estimated stall."""
    order = sorted(loads, key=lambda x: x[1])
    issue: dict[str, int] = {}
    deadline = float("inf")
    for b, u, c, earliest in reversed(order):
        begin = min(starts[u], deadline) - LOAD_MARGIN * c
        deadline = begin
        issue[b] = max([k for k in range(earliest, u + 1) if starts[k] <= begin],
                       default=earliest)
    stream, stall = 0.0, 0.0
    for b, u, c, _ in order:
        stream = max(starts[issue[b]] + stall, stream) + c
        stall += max(0.0, stream - (starts[u] + stall))
    return issue, stall


def _all_reads(sched: Schedule, params: dict[str, list[str]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for k, item in enumerate(sched.items):
        names = params.get(item.name, ()) if isinstance(item, Kernel) else _call_buffers(item)
        for b in names:
            out.setdefault(b, []).append(k)
    return out


def offloaded_outputs(g: LoweredGraph, off: Optional[Offload]) -> tuple[int, ...]:
    """The output positions whose host copy the wrapper returns."""
    moved = set(off.saves) if off else set()
    return tuple(j for j, a in enumerate(g.outputs) if isinstance(a, TensorArg) and a.buf in moved)
