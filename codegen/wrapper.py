"""Schedule -> the Python wrapper: allocates buffers, calls kernels and ATen, frees after last use.

Memory planning: a buffer dies after its last reader; a dead buffer the wrapper allocated is
reused for the next allocation of the same element count and dtype (never graph outputs); an
in-place result the storage plan (codegen/storage.py) accepted takes its target's storage.
Kernels take data pointers (C++) or tensors (Triton); buffers are allocated on `device`. With
`keep`, buffers whose storage never leaves the wrapper are allocated once and kept across calls.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from trainc.codegen.graph import Buffer, CallNode, TensorArg
from trainc.codegen.scheduler import Kernel, Schedule, _call_buffers

aten = torch.ops.aten
OUT_VARIANTS = {aten.mm.default: aten.mm.out, aten.addmm.default: aten.addmm.out,
                aten.bmm.default: aten.bmm.out}
# The same ops through torch's generated Python bindings: an OpOverload call goes through the
# boxed operator path (CPU, 2-core box: ~1.5 us more per mm, ~5.7 us more per convolution).
FAST_CALLS = {aten.mm.out: torch.mm, aten.addmm.out: torch.addmm, aten.bmm.out: torch.bmm,
              aten.convolution.default: torch.convolution, aten.addmm_.default: torch.Tensor.addmm_}


@dataclass(frozen=True)
class Wrapper:
    source: str
    namespace: dict
    # fresh_bytes: what one run allocates (wrapper + ATen results); peak_bytes: most of it
    # alive at once (pooled buffers count as alive); inplace: results written into their target
    stats: dict = field(default_factory=dict)

    def build(self, kernels: Any) -> Callable[[list], list]:
        ns = dict(self.namespace, K=kernels)
        if "KEEP" in ns:  # each built wrapper owns its kept buffers
            k = ns["KEEP"]
            ns["KEEP"] = Kept(k.nbytes, k.specs, k.device)
        exec(compile(self.source, "<trainc wrapper>", "exec"), ns)
        return ns["run"]


def _empty_cpu(size: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype)


# CPU buffers: Dynamo's allocator entry point skips the Python argument parser and the
# dispatcher (0.5 vs 2.3 us per buffer; gpt allocates ~40 per step); torch.empty_strided where
# a torch build lacks it. CUDA has one too, for the current device only (cuda_empty).
_GUARDS = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
EMPTY_CPU = getattr(_GUARDS, "_empty_strided_cpu", _empty_cpu)
EMPTY_CUDA = getattr(_GUARDS, "_empty_strided_cuda", None)


def cuda_empty(device: torch.device) -> Callable:
    """The allocator a CUDA wrapper uses for one call: Dynamo's current-device entry point when
    `device` is the current device (or names none), else torch.empty_strided on `device`."""
    if EMPTY_CUDA is not None and (device.index is None or
                                   device.index == torch.cuda.current_device()):
        return EMPTY_CUDA
    return lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype,
                                                           device=device)


def restride(t: torch.Tensor, stride) -> torch.Tensor:
    """t laid out with `stride` (inputs and ATen results the kernels index by stride): t itself
    when only the strides of size-1 dims differ (they are never used to index), else a copy.
    A target stride of 0 on a longer dim (an expanded layout) is a saved value the forward
    traced as an expand (graph inputs with other strides recompile): its slices along those
    dims are equal, so the first one is laid out and expanded."""
    if all(n == 1 or a == b for n, a, b in zip(t.shape, t.stride(), stride)):
        return t
    shape = tuple(t.shape)
    flat = [d for d, (n, b) in enumerate(zip(shape, stride)) if n > 1 and b == 0]
    for d in flat:
        t = t.narrow(d, 0, 1)
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)
    return out.expand(shape) if flat else out


SCALAR_ALIGN = 16  # bytes: Triton specializes a kernel on each pointer's 16-byte alignment


def pack_scalars(ts: Sequence[torch.Tensor]) -> torch.Tensor:
    """One-element tensors of one dtype as rows of a (n, SCALAR_ALIGN // itemsize) tensor, the
    value in column 0: row j starts 16*j bytes in, so each scalar's view is as aligned as
    Triton's precompile assumes (packed tightly, 3 in 4 float32 views were not: their kernels
    compiled again at their first launch)."""
    width = max(1, SCALAR_ALIGN // ts[0].element_size())
    # (host time before a step's first launch: one op per scalar only where one is not 0-d)
    flat = ts if all(t.dim() == 0 for t in ts) else [t.reshape(()) for t in ts]
    return torch.stack(flat).unsqueeze(1).expand(len(ts), width).clone()


def scalar_views(packed: torch.Tensor, ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The scalars of a packed (n, width) tensor, each viewed in its original shape (unbind:
    one op for all of them)."""
    views = packed[:, 0].unbind(0)
    return [v if t.dim() == 0 else v.view(t.shape) for v, t in zip(views, ts)]


def upload_scalars(device: torch.device, *ts: torch.Tensor) -> list[torch.Tensor]:
    """CPU scalars of one dtype on `device` in one host-to-device copy (already there, as in a
    CUDA graph's capture: as they are)."""
    if all(t.device == device for t in ts):
        return list(ts)
    packed = pack_scalars(ts).to(device, non_blocking=True)
    return scalar_views(packed, ts)


_watchers: list[dict] = []


def note_held(key, nbytes: int) -> None:
    """Memory allocated before a held_arenas() block that a call inside it uses (a kept arena,
    a CUDA graph's private pool): 0 when it was allocated inside the block (then its allocator
    events show it)."""
    for seen in _watchers:
        seen.setdefault(key, nbytes)


@contextlib.contextmanager
def held_arenas() -> Iterator[dict]:
    """Bytes of the kept arenas allocated before this block that calls inside it use (one entry
    per arena): memory those calls hold that no allocator event inside the block shows."""
    seen: dict = {}
    _watchers.append(seen)
    try:
        yield seen
    finally:
        _watchers.remove(seen)


class Kept:
    """Buffers a wrapper keeps across calls (no page faults from fresh allocations): views into
    one arena whose offsets the wrapper planned (buffers alive at the same time never overlap),
    so the arena is about the planned peak, not the sum of the buffers. One arena per call in
    flight, so a re-entrant or concurrent call gets its own; a call that raised never returns
    its set."""

    def __init__(self, nbytes: int, specs: list[tuple], device=None):
        self.nbytes, self.device = nbytes, device
        self.specs = specs  # (byte offset, shape, stride, dtype) per kept buffer
        self.free: list[list[torch.Tensor]] = []

    def acquire(self) -> list[torch.Tensor]:
        if self.free:
            note_held(id(self.free[-1]), self.nbytes)
            return self.free.pop()
        arena = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        bufs = [arena[off:off + _extent(shape, stride, dtype)].view(dtype).as_strided(shape, stride)
                for off, shape, stride, dtype in self.specs]
        note_held(id(bufs), 0)
        return bufs

    def release(self, bufs: list[torch.Tensor]) -> None:
        self.free.append(bufs)


class _Writer:
    def __init__(self, sched: Schedule, params: dict[str, list[str]], tensors: bool,
                 device: Optional[torch.device], host_scalars: Sequence[str] = (),
                 gemm: Optional[Callable[..., Optional[Callable]]] = None):
        self.s, self.g, self.params = sched, sched.graph, params
        self.gemm = gemm or (lambda call, inplace=False: None)
        self.host_scalars = list(host_scalars)
        self.tensors, self.device = tensors, device
        self.lines: list[str] = []
        self.ns: dict = {"torch": torch, "restride": restride, "device": torch.device,
                         "upload_scalars": upload_scalars, "inf": float("inf"),
                         "nan": float("nan"), "DEVICE": device}
        if device is None or device.type == "cpu":
            self.ns["empty"] = EMPTY_CPU
        elif device.type == "cuda":
            self.ns["cuda_empty"] = cuda_empty
        self.pool: dict[tuple, list[str]] = {}
        self.ours: set[str] = set()  # buffers the wrapper allocated (safe to reuse)
        self.storage = dict(sched.graph.storage)  # in-place result -> buffer it overwrites
        self.claimed = set(self.storage.values())
        self.drop: list[str] = []  # overwritten targets whose names die after this item
        self.live = self.peak = self.fresh = 0
        self.live_set: dict[str, int] = {}  # allocated buffer -> bytes (pooled ones included)
        self.at_peak: list[str] = []  # the live buffers when the planned peak was reached
        self.last = self._last_uses()
        self.keep = {a.buf for a in self.g.outputs if isinstance(a, TensorArg)}
        # A fallback op may return a view of its input: such buffers are freed, never reused.
        self.no_pool = {b for it in sched.items if isinstance(it, CallNode) and
                        it.kind == "fallback" for b in self._reads(it)}
        self.wanted = self._future_allocs()
        # storage roots: each name -> the allocation (or input) whose memory it uses; per
        # wrapper allocation, the index of its line (rewritten when the buffer is kept)
        self.root: dict[str, str] = {}
        self.alloc_line: dict[str, int] = {}
        self.end_line: dict[str, int] = {}  # storage root -> the last line that frees a name of it
        self.arg_views: dict[str, set] = {}  # buffer -> (shape, stride) views taken for calls

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def _last_uses(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for k, item in enumerate(self.s.items):
            for b in self._reads(item):
                last[b] = k
        return last

    def _future_allocs(self) -> list[dict[tuple, int]]:
        """Per item k: the allocations a buffer dying at k may serve from the pool: the run of
        same-key allocations that comes next. Holding a dead buffer across any other
        allocation would raise the peak; the caching allocator reuses freed memory anyway."""
        out: list[dict[tuple, int]] = [{} for _ in self.s.items]
        run: list = []  # keys of the allocations after item k, nearest first (None: ATen's)
        for k in range(len(self.s.items) - 1, -1, -1):
            first = run[0] if run else None
            n = 0
            while n < len(run) and run[n] == first:
                n += 1
            out[k] = {first: n} if first is not None and first[2] else {}
            item = self.s.items[k]
            ours = [_pool_key(self.g.buffers[b]) for b in self._allocates(item)]
            theirs = [] if isinstance(item, Kernel) or ours else \
                [None for o in item.outputs if o is not None and o not in self.storage]
            run = ours + theirs + run
        return out

    def _allocates(self, item) -> list[str]:
        if isinstance(item, Kernel):
            names = [n.name for n in item.nodes if n.name not in item.local]
        elif self._out_variant(item) is not None:
            names = [item.outputs[0]]
        else:
            names = []
        return [b for b in names if b not in self.storage]

    def _out_variant(self, c: CallNode):
        """The out= op the call runs as, into a buffer the wrapper allocates, or None."""
        if c.kwargs or self.gemm(c) is not None:
            return None
        return OUT_VARIANTS.get(c.target)

    def _reads(self, item) -> list[str]:
        """Buffers the item touches; what it produces counts too, so a result nobody reads
        (or one stored under its target's name, in place) dies right after it."""
        if isinstance(item, Kernel):
            made = [n.name for n in item.nodes if n.name not in item.local]
            return list(dict.fromkeys(list(self.params[item.name]) + made))
        return _call_buffers(item) + [o for o in item.outputs if o is not None]

    def alloc(self, name: str) -> None:
        b: Buffer = self.g.buffers[name]
        if name in self.storage:
            self._take(name)
            return
        key = _pool_key(b)
        if key[2] and self.pool.get(key):
            old = self.pool[key].pop()
            self.root[name] = self.root.get(old, old)
            self.live_set[name] = self.live_set.pop(old, b.nbytes)
            self.emit(f"{name} = {old}.view({list(b.shape)}); del {old}")
        else:
            self.alloc_line[name] = len(self.lines)
            if "empty" in self.ns or "cuda_empty" in self.ns:
                self.emit(f"{name} = empty({tuple(b.shape)}, {tuple(b.stride)}, {b.dtype})")
            else:
                self.emit(f"{name} = torch.empty_strided({list(b.shape)}, {list(b.stride)}, "
                          f"device=DEVICE, dtype={b.dtype})")
            self._grow(b.nbytes, name)
        self.ours.add(name)

    def _take(self, name: str) -> None:
        """`name` lives in the storage of the buffer its in-place op overwrote."""
        target = self.storage[name]
        self.root[name] = self.root.get(target, target)
        self.emit(f"{name} = {target}  # in place")
        if target in self.ours:
            self.ours.add(name)
        self.drop.append(target)

    def _grow(self, nbytes: int, name: str) -> None:
        self.fresh += nbytes
        self.live += nbytes
        self.live_set[name] = nbytes
        if self.live > self.peak:
            self.peak = self.live
            self.at_peak = list(self.live_set)

    def free(self, k: int, item) -> None:
        # inputs too: run() empties its argument list, so a saved activation the caller handed
        # over (the backward's) is freed after its last use, not when the backward returns
        dead = sorted({b for b in self._reads(item) if self.last.get(b) == k} - self.keep
                      - set(self.g.consts) - self.claimed)
        for b in dead:
            buf = self.g.buffers[b]
            key = _pool_key(buf)
            pooled = self.pool.setdefault(key, [])
            if b in self.ours and b not in self.no_pool and \
                    len(pooled) < self.wanted[k].get(key, 0):
                pooled.append(b)
            else:
                self.emit(f"del {b}")
                self._ended(b)
                if buf.kind in ("compute", "call") and not self._overwrote(b):
                    self.live -= buf.nbytes
                    self.live_set.pop(b, None)
        for t in self.drop:
            self.emit(f"del {t}")
            self._ended(t)
        self.drop = []

    def _ended(self, name: str) -> None:
        root = self.root.get(name, name)
        self.end_line[root] = max(self.end_line.get(root, 0), len(self.lines))

    def _overwrote(self, b: str) -> bool:
        """b took the storage of a graph input: freeing the name frees no memory."""
        root = b
        while root in self.storage:
            root = self.storage[root]
        return root in self.g.inputs

    def write(self) -> str:
        g = self.g
        self.emit(f"{', '.join(g.params) + ',' if g.params else '_'} = args")
        self.emit("args.clear()")  # run(args) takes the inputs over: see free()
        self.unchecked = list(g.inputs)
        self.uploads = self._scalar_groups()
        if "cuda_empty" in self.ns:  # looked up once per call
            self.emit("empty = cuda_empty(DEVICE)")
        for name, t in g.consts.items():
            self.ns[name] = t
        launches = self.tensors and any(isinstance(it, Kernel) for it in self.s.items)
        if launches:  # Triton: the stream and launch hooks, looked up once per call
            self.emit("K.begin()")
        for k, item in enumerate(self.s.items):
            self._prepare_inputs(set(self._reads(item)))
            if isinstance(item, Kernel):
                self._kernel(item)
            else:
                self._call(item)
            self.free(k, item)
        self._prepare_inputs(set(g.inputs))  # inputs only returned
        if launches:  # (a call that raised leaves it set: the next call sets it again)
            self.emit("K.end()")
        outs = ", ".join(self._arg(a) for a in g.outputs)
        self.emit(f"return [{outs}]")
        return "def run(args):\n" + "\n".join(self.lines) + "\n"

    def _scalar_groups(self) -> list[list[str]]:
        """CPU scalars of a CUDA graph (optimizer step counts and hyperparameters, the RNG
        seed) go to the device in one copy per dtype, not one per kernel launch that reads
        them."""
        groups: dict[torch.dtype, list[str]] = {}
        for name in self.host_scalars:
            groups.setdefault(self.g.buffers[name].dtype, []).append(name)
        return list(groups.values())

    def _prepare_inputs(self, names: set[str]) -> None:
        """Each input's layout check, and the upload of its group of CPU scalars, just before
        the first item that reads it: the host reaches the step's first launches sooner (the
        GPU waits for them), and the rest runs while kernels do."""
        for name in [n for n in self.unchecked if n in names]:
            b = self.g.buffers[name]
            self.emit(f"if {name}.stride() != {b.stride} and {name}.numel() > 1: "
                      f"{name} = restride({name}, {b.stride})")
            self.unchecked.remove(name)
        for group in [u for u in self.uploads if names.intersection(u)]:
            self.emit(f"{', '.join(group)}, = upload_scalars(DEVICE, {', '.join(group)})")
            self.uploads.remove(group)

    def peak_live(self, top: int = 12) -> list[tuple]:
        """The largest buffers live at the planned peak: (name, shape, dtype, bytes, graph
        nodes that made it), for the debug dump and explain()."""
        made = {n.name: n.origins for it in self.s.items if isinstance(it, Kernel)
                for n in it.nodes}
        made.update({o: (c.origin,) for c in self.s.items if isinstance(c, CallNode)
                     for o in c.outputs if o is not None})
        rows = sorted(((self.g.buffers[n].nbytes, n) for n in self.at_peak), reverse=True)
        return [(n, tuple(self.g.buffers[n].shape), str(self.g.buffers[n].dtype), nb,
                 tuple(made.get(n, ()))) for nb, n in rows[:top]]

    def keep_buffers(self) -> int:
        """Rewrite the allocations whose storage never leaves the wrapper (not an output, not
        read by an ATen op that may return a view of it) to take kept buffers; their bytes."""
        from trainc.codegen.storage import _may_alias
        leaving = {a.buf for a in self.g.outputs if isinstance(a, TensorArg)}
        for it in self.s.items:
            if isinstance(it, CallNode) and (it.kind == "fallback" or _may_alias(it.target)):
                leaving |= set(_call_buffers(it))
        leaving = {self.root.get(b, b) for b in leaving}
        kept = [b for b in self.alloc_line if b not in leaving]
        if not kept:
            return 0
        bufs = [self.g.buffers[b] for b in kept]
        spans = [(self.alloc_line[b], self.end_line.get(b, len(self.lines))) for b in kept]
        offsets, total = _pack([_extent(b.shape, b.stride, b.dtype) for b in bufs], spans)
        specs = []
        for k, (name, b, off) in enumerate(zip(kept, bufs, offsets)):
            shape, stride = self._kept_view(name, b)
            specs.append((off, shape, stride, b.dtype))
            self.lines[self.alloc_line[name]] = \
                f"    {name} = KEPT[{k}]  # {list(shape)} strides {list(stride)}"
        self.ns["KEEP"] = Kept(total, specs, self.device)
        self.lines.insert(1, "    KEPT = KEEP.acquire()")
        self.lines.insert(len(self.lines) - 1, "    KEEP.release(KEPT)")
        return total

    def _kept_view(self, name: str, b: Buffer) -> tuple[tuple, tuple]:
        """The layout a kept buffer is made with. Where the wrapper's only use of it besides
        data pointers is one view for ATen calls (a channels-last convolution argument:
        `buf.as_strided(logical shape, strides)`) spanning the same bytes, the kept tensor is that
        view, made once, and the calls take it as is."""
        own = tuple(b.shape), tuple(b.stride)
        views = self.arg_views.get(name, set())
        if len(views) != 1:
            return own
        shape, stride = next(iter(views))
        if _extent(shape, stride, b.dtype) != _extent(b.shape, b.stride, b.dtype):
            return own
        view = name + _view_text(shape, stride)
        uses = (view, f"{name}.data_ptr()", f"{name} = ", f"del {name}")
        pattern = re.compile(rf"\b{name}\b")
        for line in self.lines:
            rest = line
            for use in uses:
                rest = rest.replace(use, "")
            if pattern.search(rest):
                return own  # used another way too: keep the buffer's own layout
        self.lines = [line.replace(view, name) for line in self.lines]
        return shape, stride

    def _kernel(self, k: Kernel) -> None:
        for n in k.nodes:
            if n.name not in k.local:
                self.alloc(n.name)
        ptr = "" if self.tensors else ".data_ptr()"
        ptrs = ", ".join(f"{b}{ptr}" for b in self.params[k.name])
        self.emit(f"K.{k.name}({ptrs})")

    def _call(self, c: CallNode) -> None:
        op = f"op_{len([x for x in self.ns if x.startswith('op_')])}"
        args = ", ".join(self._arg(a) for a in c.args)
        kwargs = "".join(f", {k}={self._arg(v)}" for k, v in c.kwargs.items())
        if c.inplace is not None and c.outputs and c.outputs[0] in self.storage:
            target, key = c.inplace
            self.ns[op] = self.gemm(c, inplace=True) or FAST_CALLS.get(target, target)
            dest = self.storage[c.outputs[0]]
            kwargs += f", {key}={dest}" if isinstance(key, str) else ""
            self.emit(f"{op}({args}{kwargs})  # {c.kind} in place {c.origin}")
            self._take(c.outputs[0])
            return
        out_variant = self._out_variant(c)
        if out_variant is not None:
            self.ns[op] = FAST_CALLS.get(out_variant, out_variant)
            self.alloc(c.outputs[0])
            self.emit(f"{op}({args}, out={c.outputs[0]})  # {c.origin}")
            return
        self.ns[op] = self.gemm(c) or FAST_CALLS.get(c.target, c.target)
        for o in c.outputs:
            if o is not None:
                self._grow(self.g.buffers[o].nbytes, o)
        names = [o or "_" for o in c.outputs]
        single = not isinstance(_result_kind(c), tuple)
        lhs = names[0] if single else ", ".join(names) + ","
        self.emit(f"{lhs} = {op}({args}{kwargs})  # {c.kind} {c.origin}")
        for o in c.outputs:
            if o is not None:
                b = self.g.buffers[o]
                self.emit(f"if {o}.stride() != {b.stride} and {o}.numel() > 1: "
                          f"{o} = restride({o}, {b.stride})")

    def _arg(self, a) -> str:
        if isinstance(a, TensorArg):
            if a.whole:
                return a.buf
            if a.offset == 0:  # as_strided keeps the base's storage offset by default
                self.arg_views.setdefault(a.buf, set()).add((tuple(a.shape), tuple(a.stride)))
                return a.buf + _view_text(a.shape, a.stride)
            return (f"{a.buf}.as_strided({list(a.shape)}, {list(a.stride)}, "
                    f"{a.buf}.storage_offset() + {a.offset})")
        if isinstance(a, (list, tuple)):
            inner = ", ".join(self._arg(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        if isinstance(a, torch.dtype):
            return str(a)
        if isinstance(a, (torch.device, torch.memory_format, torch.layout)):
            return f"torch.{a}" if not isinstance(a, torch.device) else repr(a)
        return repr(a)


def _result_kind(c: CallNode):
    return tuple(c.outputs) if len(c.outputs) != 1 or _returns_tuple(c.target) else c.outputs[0]


def _returns_tuple(target) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and len(schema.returns) > 1 or (
        schema is not None and len(schema.returns) == 1 and
        str(schema.returns[0].type).startswith(("Tensor[]", "List")))


ALIGN = 64  # bytes; every kept buffer starts on a cache line


def _view_text(shape, stride) -> str:
    return f".as_strided({list(shape)}, {list(stride)})"


def _extent(shape, stride, dtype) -> int:
    """Bytes a strided layout spans (0 for an empty tensor)."""
    if any(n == 0 for n in shape):
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(shape, stride))) * dtype.itemsize


def _pack(sizes: list[int], spans: list[tuple[int, int]]) -> tuple[list[int], int]:
    """Byte offsets for buffers alive over `spans` (inclusive line ranges): largest first, each
    at the lowest aligned offset clear of every placed buffer whose span overlaps its own.
    Returns (offsets, arena bytes)."""
    offsets = [0] * len(sizes)
    placed: list[int] = []
    for k in sorted(range(len(sizes)), key=lambda k: (-sizes[k], spans[k])):
        busy = sorted((offsets[j], offsets[j] + sizes[j]) for j in placed
                      if spans[j][0] <= spans[k][1] and spans[k][0] <= spans[j][1] and sizes[j])
        at = 0
        for lo, hi in busy:
            if at + sizes[k] <= lo:
                break
            at = max(at, -(-hi // ALIGN) * ALIGN)
        offsets[k] = at
        placed.append(k)
    total = max((offsets[k] + sizes[k] for k in range(len(sizes))), default=0)
    return offsets, -(-total // ALIGN) * ALIGN


def _pool_key(b: Buffer) -> tuple:
    return (b.nbytes, b.dtype, b.stride == _contig(b.shape))


def _contig(shape) -> tuple:
    from trainc.codegen.ir import contiguous_strides
    return contiguous_strides(shape)


def _peak_comment(stats: dict) -> str:
    """The planned peak and the largest buffers live there, as a comment atop the wrapper."""
    lines = [f"# planned peak {stats['peak_bytes'] / 2**20:.3f} MiB of buffers this wrapper "
             f"allocates; the largest live there:"]
    lines += [f"#   {name:10s} {str(list(shape)):24s} {dtype:15s} {nb / 2**20:9.3f} MiB  "
              f"{', '.join(origins)[:60]}" for name, shape, dtype, nb, origins in
              stats["peak_live"]]
    return "\n".join(lines) + "\n"


def write_wrapper(sched: Schedule, params: dict[str, list[str]], *, tensors: bool = False,
                  device: Optional[torch.device] = None, keep: bool = False,
                  host_scalars: Sequence[str] = (),
                  gemm: Optional[Callable[..., Optional[Callable]]] = None) -> Wrapper:
    """`params`: per kernel name, the buffers it takes, in order: as data pointers (C++
    functions through ctypes) or, with `tensors`, as tensors (Triton launchers). Buffers are
    allocated on `device` (None: torch's default device); with `keep`, those that never leave
    the wrapper once, then kept across calls (stats["kept_bytes"]). `host_scalars`: one-element
    CPU inputs of a graph whose kernels run on `device`, copied there once per call. `gemm`:
    per mm/addmm call (and `inplace=True`: one run in place), a function to call instead of
    ATen's out= or in-place form (codegen/cpp/gemm.py), or None."""
    w = _Writer(sched, params, tensors, device, host_scalars, gemm)
    w.write()
    kept = w.keep_buffers() if keep else 0
    stats = {"fresh_bytes": w.fresh - kept, "peak_bytes": w.peak, "inplace": len(w.storage),
             "kept_bytes": kept, "peak_live": w.peak_live(),
             # the layout of each tensor output (None: not a tensor), for the next graph's inputs
             "output_strides": tuple(tuple(a.stride) if isinstance(a, TensorArg) else None
                                     for a in sched.graph.outputs)}
    source = _peak_comment(stats) + "def run(args):\n" + "\n".join(w.lines) + "\n"
    return Wrapper(source, w.ns, stats)
