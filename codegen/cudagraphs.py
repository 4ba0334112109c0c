"""CompiledGraph -> the same graph replayed as a CUDA graph (options={"cudagraphs": True}; the
default for compile_step on CUDA).

Call 1 runs normally (compiles, autotunes). Call 2 captures (compile_step's default: call 2
runs plainly, timed, and call 3 captures if worth it). Inputs that keep their memory from
call to call (parameters, buffers, optimizer state) are captured in place; the others (the
batch, CPU scalars such as hyperparameters, step counts and the RNG seed) get static buffers
that each replay copies into, the CPU scalars in one host-to-device copy per dtype. Which inputs
stay put: the graph says so when its producer marked them (`mark_static_inputs`, compile_step
and the forward of trainc.compile do); else inputs whose address did not change between calls 1
and 2 are taken as staying. A captured-in-place input that moves triggers a re-capture (at most
MAX_CAPTURES, then plain runs). Outputs in the graph's pool are cloned (a later replay would
overwrite them). The pool holds the graph's buffers between replays: `held_bytes` (the segments
of that pool, as the allocator reserved them: more than the live peak when large buffers of
mixed sizes fragment it) is what trainc.report.peak_bytes adds for a run that replays it.

compile_step's default ("auto"): a step whose host work is under half its GPU time, or whose
copied inputs outweigh its launches, is not captured (`worth_it`). Each graph has a private
pool: a step that sees two batch shapes holds two.
"""
from __future__ import annotations

import time
from typing import Iterable, Optional

import torch
import torch.fx as fx

from trainc.codegen import CompiledGraph
from trainc.codegen.wrapper import note_held, pack_scalars, scalar_views

MAX_CAPTURES = 3
MIN_HOST_SHARE = 0.5  # host ms per GPU ms below which a replay saves nothing
COPY_BYTES_PER_LAUNCH = 4 << 20  # ~ the time of one launch's host work, as bytes of copy
STATIC_INPUTS = "trainc_static_inputs"  # gm.meta key: names of placeholders that stay put


def mark_static_inputs(gm: fx.GraphModule, names: Iterable[str]) -> fx.GraphModule:
    """Declare which placeholders keep their memory between calls (the rest are copied into
    static buffers on every replay, however stable their address looks)."""
    gm.meta[STATIC_INPUTS] = frozenset(names)
    return gm


class CudaGraphRunner:
    def __init__(self, run, static: Optional[list[bool]] = None,
                 launches: Optional[int] = None, kept_bytes: int = 0):
        self.inner = run
        self.kept_bytes = kept_bytes
        self.launches = launches  # kernels per call; None: always capture (cudagraphs=True)
        self.declared = static  # per input: stays put (None: judge by address)
        self.calls = self.captures = 0
        self.first_ptrs: Optional[list] = None
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.stable: list[bool] = []
        self.ptrs: list = []  # data_ptr of each captured-in-place input
        self.static: list = []
        self.copied: list[int] = []  # CUDA inputs copied into static buffers per replay
        self.host: list[tuple[list[int], torch.Tensor]] = []  # CPU scalars: (positions, buffer)
        self.outs: list = []
        self.keep: set = set()
        self.held_bytes = 0
        self.host_share: Optional[float] = None  # host ms / GPU ms of a plain call (auto)
        self.note = "not captured yet"

    def __call__(self, args: list) -> list:
        self.calls += 1
        if self.calls == 1 or self.captures >= MAX_CAPTURES:
            self.first_ptrs = _ptrs(args)
            return self.inner(args)
        if self.graph is None and self.launches is not None and self.host_share is None:
            return self._timed(args)  # auto: one plain run, timed, before deciding
        if self.graph is None and not self.worth_it(args):
            self.captures = MAX_CAPTURES  # plain runs from now on
            return self.inner(args)
        if self.graph is None or self._moved(args):
            self._capture(args)
        else:
            self._copy_in(args)
            note_held(id(self), self.held_bytes)
        self.graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) and o.data_ptr() not in self.keep
                else o for o in self.outs]

    def _timed(self, args: list) -> list:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        start.record()
        out = self.inner(args)
        end.record()
        host = (time.perf_counter() - t) * 1e3
        end.synchronize()
        self.host_share = host / max(start.elapsed_time(end), 1e-3)
        return out

    def worth_it(self, args: list) -> bool:
        """A replay saves the host time of each launch (a few microseconds) and costs a copy of
        every input that does not stay put, and its private pool holds memory. Not worth it:
        a call whose host work takes under MIN_HOST_SHARE of its GPU time (the GPU never waits
        for the host), or inputs of more than COPY_BYTES_PER_LAUNCH per kernel (the copies cost
        more than the launches saved; measured: BENCHMARKS.md)."""
        if self.launches is None:
            return True
        if self.host_share is not None and self.host_share < MIN_HOST_SHARE:
            self.note = (f"not captured: its host work takes {self.host_share:.0%} of its GPU "
                         "time (the GPU does not wait for launches)")
            return False
        declared = self.declared or [False] * len(args)
        copied = sum(a.nbytes for a, s in zip(args, declared)
                     if isinstance(a, torch.Tensor) and a.is_cuda and not s)
        if copied <= COPY_BYTES_PER_LAUNCH * max(self.launches, 1):
            return True
        self.note = (f"not captured: it would copy {copied >> 20} MiB of inputs per call for "
                     f"{self.launches} kernels")
        return False

    def _capture(self, args: list) -> None:
        now = _ptrs(args)
        first = self.first_ptrs or now
        self.stable = [isinstance(a, torch.Tensor) and a.is_cuda and
                       (self.declared[i] if self.declared is not None else now[i] == first[i])
                       for i, a in enumerate(args)]
        self.static = [a if s or not isinstance(a, torch.Tensor) else None
                       for a, s in zip(args, self.stable)]
        self._static_buffers(args)
        self._copy_in(args)
        torch.cuda.synchronize()
        note_held(id(self), 0)  # captured inside a measured block: its allocations show
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outs = self.inner(list(self.static))
        # plus the wrapper's kept arena (triton_keep_buffers): allocated before the capture,
        # its addresses are in the graph, and a replay runs no Python that would note it
        self.held_bytes = _pool_bytes(self.graph.pool()) + self.kept_bytes
        self.ptrs = [p for p, s in zip(now, self.stable) if s]
        self.keep = set(self.ptrs)
        self.first_ptrs = now
        self.captures += 1
        self.note = (f"captured {self.captures}x; {sum(self.stable)} inputs in place, "
                     f"{len(self.copied) + sum(len(p) for p, _ in self.host)} copied")

    def _static_buffers(self, args: list) -> None:
        """CUDA buffers for the inputs a replay copies in: one per CUDA input; the CPU scalars
        of each dtype are views into one buffer, so their upload is one copy."""
        self.copied, groups = [], {}
        for i, (a, s) in enumerate(zip(args, self.stable)):
            if s or not isinstance(a, torch.Tensor):
                continue
            if not a.is_cuda and a.numel() == 1:
                groups.setdefault(a.dtype, []).append(i)
                continue
            self.static[i] = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype,
                                                 device="cuda")
            self.copied.append(i)
        self.host = []
        for pos in groups.values():  # rows 16 bytes apart: aligned as the kernels assume
            buf = pack_scalars([args[i] for i in pos]).to("cuda")
            for i, view in zip(pos, scalar_views(buf, [args[i] for i in pos])):
                self.static[i] = view
            self.host.append((pos, buf))

    def _moved(self, args: list) -> bool:
        """A captured-in-place input is another tensor now: the graph would read stale memory."""
        now = [a.data_ptr() for a, s in zip(args, self.stable) if s]
        return now != self.ptrs

    def _copy_in(self, args: list) -> None:
        for i in self.copied:
            self.static[i].copy_(args[i])
        for pos, buf in self.host:  # pageable source: staged by the driver, no sync
            buf.copy_(pack_scalars([args[i] for i in pos]), non_blocking=True)


def _pool_bytes(pool) -> int:
    """Bytes of the memory segments a CUDA graph's private pool holds."""
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
               if tuple(seg.get("segment_pool_id", ())) == tuple(pool))


def _ptrs(args: list) -> list:
    return [a.data_ptr() if isinstance(a, torch.Tensor) and a.is_cuda else None for a in args]


def with_cudagraphs(compiled: CompiledGraph, gm: Optional[fx.GraphModule] = None,
                    auto: bool = False) -> CompiledGraph:
    """`auto` (the default cudagraphs of compile_step): capture only when the launches a replay
    saves outweigh the inputs it copies in (see CudaGraphRunner.worth_it). A graph with
    offloaded buffers is not replayed: its copies to and from host memory run on side streams
    with allocations a capture cannot hold."""
    plan = compiled.extra.get("memory_plan")
    if plan is not None and plan.offload:
        return compiled
    static = None
    if gm is not None and STATIC_INPUTS in gm.meta:
        names = gm.meta[STATIC_INPUTS]
        static = [n.name in names for n in gm.graph.nodes if n.op == "placeholder"]
    runner = CudaGraphRunner(compiled.run, static, len(compiled.kernels) if auto else None,
                             int(compiled.extra.get("kept_bytes", 0)))
    extra = dict(compiled.extra, cudagraphs=runner)
    return CompiledGraph(runner, compiled.kernels, compiled.fallback_ops, compiled.source, extra)
