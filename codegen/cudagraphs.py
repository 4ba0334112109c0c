"""CompiledGraph -> the same graph replayed as a CUDA graph (options={"cudagraphs": True}).

Call 1 runs normally (compiles, autotunes). Call 2 captures: inputs whose address did not change
between calls (parameters, optimizer state) are captured in place; the others get static buffers
that each replay copies into. Outputs in the graph's private pool are cloned (a later replay
would overwrite them). A stable input that moves triggers a re-capture (at most MAX_CAPTURES).
The private pool holds the graph's buffers between replays: `held_bytes` (the segments of that
pool) is what trainc.report.peak_bytes adds for a run that replays it.
"""
from __future__ import annotations

from typing import Optional

import torch

from trainc.codegen import CompiledGraph
from trainc.codegen.wrapper import note_held

MAX_CAPTURES = 3


class CudaGraphRunner:
    def __init__(self, run):
        self.inner = run
        self.calls = self.captures = 0
        self.first_ptrs: Optional[list] = None
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.stable: list[bool] = []
        self.ptrs: list = []
        self.static: list = []
        self.outs: list = []
        self.held_bytes = 0
        self.note = "not captured yet"

    def __call__(self, args: list) -> list:
        self.calls += 1
        if self.calls == 1 or self.captures >= MAX_CAPTURES:
            self.first_ptrs = _ptrs(args)
            return self.inner(args)
        if self.graph is None or self._moved(args):
            self._capture(args)
        else:
            self._copy_in(args)
            note_held(id(self), self.held_bytes)
        self.graph.replay()
        keep = {p for p, s in zip(self.ptrs, self.stable) if s and p is not None}
        return [o.clone() if isinstance(o, torch.Tensor) and o.data_ptr() not in keep else o
                for o in self.outs]

    def _capture(self, args: list) -> None:
        now = _ptrs(args)
        self.stable = [isinstance(a, torch.Tensor) and a.is_cuda and p == q
                       for a, p, q in zip(args, now, self.first_ptrs or now)]
        self.static = [a if s or not isinstance(a, torch.Tensor) else _static_like(a)
                       for a, s in zip(args, self.stable)]
        self._copy_in(args)
        torch.cuda.synchronize()
        note_held(id(self), 0)  # captured inside a measured block: its allocations show
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outs = self.inner(list(self.static))
        self.held_bytes = _pool_bytes(self.graph.pool())
        self.ptrs = [p if s else None for p, s in zip(now, self.stable)]
        self.first_ptrs = now
        self.captures += 1
        self.note = (f"captured {self.captures}x; {sum(self.stable)} inputs in place, "
                     f"{sum(1 for a, s in zip(args, self.stable) if not s and _t(a))} copied")

    def _moved(self, args: list) -> bool:
        """A captured-in-place input is another tensor now: the graph would read stale memory."""
        return any(s and _ptrs([a])[0] != p for a, s, p in zip(args, self.stable, self.ptrs))

    def _copy_in(self, args: list) -> None:
        for a, s, st in zip(args, self.stable, self.static):
            if not s and isinstance(a, torch.Tensor):
                st.copy_(a)


def _pool_bytes(pool) -> int:
    """Bytes of the memory segments a CUDA graph's private pool holds."""
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
               if tuple(seg.get("segment_pool_id", ())) == tuple(pool))


def _t(a) -> bool:
    return isinstance(a, torch.Tensor)


def _ptrs(args: list) -> list:
    return [a.data_ptr() if isinstance(a, torch.Tensor) and a.is_cuda else None for a in args]


def _static_like(a: torch.Tensor) -> torch.Tensor:
    """A CUDA buffer for an input that moves between calls (CPU scalars such as the RNG seed
    and hyperparameters included: a replay can only read device memory)."""
    return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="cuda")


def with_cudagraphs(compiled: CompiledGraph) -> CompiledGraph:
    runner = CudaGraphRunner(compiled.run)
    extra = dict(compiled.extra, cudagraphs=runner)
    return CompiledGraph(runner, compiled.kernels, compiled.fallback_ops, compiled.source, extra)
