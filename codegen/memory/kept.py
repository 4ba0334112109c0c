"""Buffers kept across calls: which of the wrapper's allocations, their offsets in one arena, and
the arena itself at run time (`Kept`).

A kept buffer's storage never leaves the wrapper (not an output, not read by an ATen op that
may return a view of it). Buffers alive at the same time never overlap in the arena, so it is
about the planned peak, not the sum of the buffers.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from trainc.codegen.graph import CallNode, TensorArg
from trainc.codegen.memory.inplace import may_alias
from trainc.codegen.memory.walk import Walk
from trainc.codegen.scheduler import Kernel, Schedule, _call_buffers

ALIGN = 64  # bytes; every kept buffer starts on a cache line


@dataclass(frozen=True)
class KeptBuffer:
    buf: str
    offset: int  # bytes into the arena
    nbytes: int  # bytes its layout spans
    shape: tuple[int, ...]  # the layout it is made with
    stride: tuple[int, ...]
    dtype: torch.dtype
    view: bool  # made as the one view ATen calls take of it (then they take it as is)
    span: tuple[int, int]  # first and last event (inclusive) its storage is in use

    def __str__(self) -> str:
        view = "  (the calls' view, made once)" if self.view else ""
        return (f"{self.buf:10s} offset {self.offset:10d}  {self.nbytes:10d} B  "
                f"{list(self.shape)} strides {list(self.stride)} {self.dtype}  "
                f"events {self.span[0]}-{self.span[1]}{view}")


def plan_kept(sched: Schedule, w: Walk, params: dict[str, list[str]],
              tensors: bool) -> tuple[tuple[KeptBuffer, ...], int]:
    """The wrapper's allocations kept across calls and the arena's bytes. `tensors`: kernels
    take tensors (Triton), not data pointers, so a kernel argument is a use of the tensor."""
    leaving = {a.buf for a in sched.graph.outputs if isinstance(a, TensorArg)}
    for it in sched.items:
        if isinstance(it, CallNode) and (it.kind == "fallback" or may_alias(it.target)):
            leaving |= set(_call_buffers(it))
    leaving = {w.root.get(b, b) for b in leaving}
    kept = [(i, e.buf) for i, e in enumerate(w.events) if e.kind == "alloc" and
            e.buf not in leaving]
    if not kept:
        return (), 0
    ends: dict[str, int] = {}
    for i, e in enumerate(w.events):
        if e.kind in ("free", "drop"):
            ends[w.root.get(e.buf, e.buf)] = i
    bufs = [sched.graph.buffers[b] for _, b in kept]
    spans = [(i, ends.get(b, len(w.events))) for i, b in kept]
    sizes = [extent(b.shape, b.stride, b.dtype) for b in bufs]
    offsets, total = pack(sizes, spans)
    views, used = _uses(sched, w, params, tensors)
    out = []
    for b, off, size, span in zip(bufs, offsets, sizes, spans):
        shape, stride, view = _layout(b, views.get(b.name, set()), b.name in used)
        out.append(KeptBuffer(b.name, off, size, shape, stride, b.dtype, view, span))
    return tuple(out), total


def _layout(b, views: set, used: bool) -> tuple[tuple, tuple, bool]:
    """The layout a kept buffer is made with, and whether it is the calls' view. Where the wrapper's only use of it besides data
    pointers is one view for ATen calls (a channels-last convolution argument) spanning the same
    bytes, the kept tensor is that view, made once, and the calls take it as is."""
    own = tuple(b.shape), tuple(b.stride), False
    if len(views) != 1 or used:
        return own
    shape, stride = next(iter(views))
    if extent(shape, stride, b.dtype) != extent(b.shape, b.stride, b.dtype):
        return own
    return shape, stride, True


def _uses(sched: Schedule, w: Walk, params: dict[str, list[str]],
          tensors: bool) -> tuple[dict[str, set], set[str]]:
    """Per buffer, the (shape, stride) views ATen calls take of it from offset 0, and the set
    of buffers the wrapper uses any other way (as a tensor: a kernel's argument under
    `tensors`, a call's whole argument, out= or in-place target, a view at an offset, the
    storage a reuse or an in-place result takes)."""
    views: dict[str, set] = {}
    used: set[str] = set()

    def arg(a) -> None:
        if isinstance(a, TensorArg):
            if not a.whole and a.offset == 0:
                views.setdefault(a.buf, set()).add((tuple(a.shape), tuple(a.stride)))
            else:
                used.add(a.buf)
        elif isinstance(a, (list, tuple)):
            for x in a:
                arg(x)

    for item, form in zip(sched.items, w.forms):
        if isinstance(item, Kernel):
            used.update(params[item.name] if tensors else ())
            continue
        arg(item.args)
        arg(list(item.kwargs.values()))
        if form == "out":
            used.add(item.outputs[0])
        elif form == "inplace" and isinstance(item.inplace[1], str):
            used.add(sched.graph.storage[item.outputs[0]])
    used.update(e.src for e in w.events if e.kind in ("reuse", "inplace"))
    return views, used


def extent(shape, stride, dtype) -> int:
    """Bytes a strided layout spans (0 for an empty tensor)."""
    if any(n == 0 for n in shape):
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(shape, stride))) * dtype.itemsize


def pack(sizes: list[int], spans: list[tuple[int, int]]) -> tuple[list[int], int]:
    """Byte offsets for buffers alive over `spans` (inclusive event ranges): largest first,
    each at the lowest aligned offset clear of every placed buffer whose span overlaps its own.
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
    """The kept buffers at run time: views into one arena at their planned offsets. One arena
    per call in flight, so a re-entrant or concurrent call gets its own; a call that raised
    never returns its set."""

    def __init__(self, nbytes: int, specs: list[tuple], device=None):
        self.nbytes, self.device = nbytes, device
        self.specs = specs  # (byte offset, shape, stride, dtype) per kept buffer
        self.free: list[list[torch.Tensor]] = []

    def acquire(self) -> list[torch.Tensor]:
        if self.free:
            note_held(id(self.free[-1]), self.nbytes)
            return self.free.pop()
        arena = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        bufs = [arena[off:off + extent(shape, stride, dtype)].view(dtype).as_strided(shape, stride)
                for off, shape, stride, dtype in self.specs]
        note_held(id(bufs), 0)
        return bufs

    def release(self, bufs: list[torch.Tensor]) -> None:
        self.free.append(bufs)
