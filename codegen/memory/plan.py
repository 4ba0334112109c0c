"""Schedule -> MemoryPlan: the wrapper's memory as data, decided before the wrapper is printed.

The events (walk.py) in order, the live bytes after each, the buffers kept across calls with
their arena offsets (kept.py), and the planned peak with the buffers live there. Live bytes
count what the wrapper allocates and what ATen returns; a pooled dead buffer counts as live.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Optional

from trainc.codegen.graph import CallNode
from trainc.codegen.memory.kept import KeptBuffer, plan_kept
from trainc.codegen.memory.offload import Offload, offloaded_outputs
from trainc.codegen.memory.walk import Event, walk
from trainc.codegen.scheduler import Kernel, Schedule

MiB = 2 ** 20


@dataclass(frozen=True)
class MemoryPlan:
    events: tuple[Event, ...]
    forms: tuple[str, ...]  # per schedule item: "kernel", or a call's "inplace" | "out" | "aten"
    storage: tuple[tuple[str, str], ...]  # in-place results and the buffers they overwrite
    kept: tuple[KeptBuffer, ...] = ()
    arena_bytes: int = 0
    # the graph's tensor inputs in placeholder order, with their bytes: the plan never counts
    # them live (the caller allocated them), but frees them after their last use (free events)
    inputs: tuple[tuple[str, int], ...] = ()
    offload: Optional[Offload] = None  # buffers moved to host and back (offload.py)
    moved: tuple[int, ...] = ()  # output positions the wrapper returns as host copies
    moved_nodes: tuple[str, ...] = ()  # OFFLOAD_NODE tags whose buffers move within the graph

    @cached_property
    def live_bytes(self) -> tuple[int, ...]:
        """Per event, the planned live bytes after it."""
        out, live = [], 0
        for e in self.events:
            live += e.delta
            out.append(live)
        return tuple(out)

    @property
    def peak_bytes(self) -> int:
        return max(self.live_bytes, default=0)

    @property
    def peak_event(self) -> Optional[int]:
        """The first event at the planned peak (None when nothing is allocated)."""
        peak = self.peak_bytes
        return self.live_bytes.index(peak) if peak > 0 else None

    @property
    def at_peak(self) -> dict[str, int]:
        """The buffers live at the planned peak and their bytes."""
        i = self.peak_event
        return {} if i is None else self.live_at(i)

    @property
    def fresh_bytes(self) -> int:
        """What one run allocates (wrapper and ATen), kept buffers included."""
        return sum(e.delta for e in self.events if e.delta > 0)

    def live_at(self, i: int) -> dict[str, int]:
        """The buffers live after event i, each under the name that holds its storage then."""
        if not 0 <= i < len(self.events):
            raise IndexError(f"memory plan: no event {i} (it has {len(self.events)})")
        live: dict[str, int] = {}
        for e in self.events[:i + 1]:
            if e.kind in ("alloc", "aten", "prefetch"):
                live[e.buf] = e.delta
            elif e.kind in ("reuse", "inplace") and e.src in live:
                live[e.buf] = live.pop(e.src)
            elif e.kind == "free":
                live.pop(e.buf, None)
        return live

    def item_events(self, k: int) -> list[Event]:
        return self._by_item.get(k, [])

    @cached_property
    def _by_item(self) -> dict[int, list[Event]]:
        out: dict[int, list[Event]] = {}
        for e in self.events:
            out.setdefault(e.item, []).append(e)
        return out

    def __str__(self) -> str:
        peak, at = self.peak_bytes, self.peak_event
        lines = [f"memory plan: {len(self.forms)} items, {len(self.events)} events; planned peak "
                 f"{peak} B ({peak / MiB:.3f} MiB) at event {at}; fresh {self.fresh_bytes} B; "
                 f"{len(self.storage)} in place; {len(self.kept)} kept in a "
                 f"{self.arena_bytes} B arena", "", "events (live bytes after each):"]
        for i, (e, live) in enumerate(zip(self.events, self.live_bytes)):
            mark = "  <- peak" if i == at else ""
            lines.append(f"  {i:5d}  {e}  live {live:12d}{mark}")
        lines += ["", f"live at the peak (event {at}):"]
        lines += [f"  {name:10s} {nb:12d} B" for name, nb in
                  sorted(self.at_peak.items(), key=lambda x: (-x[1], x[0]))]
        if self.storage:
            lines += ["", "in place (result <- the buffer it overwrites):"]
            lines += [f"  {x} <- {t}" for x, t in self.storage]
        if self.offload:
            lines += ["", str(self.offload)]
        if self.kept:
            lines += ["", f"kept across calls (arena {self.arena_bytes} B):"]
            lines += [f"  {k}" for k in self.kept]
        return "\n".join(lines) + "\n"


def plan_memory(sched: Schedule, params: dict[str, list[str]], *, keep: bool = False,
                tensors: bool = False,
                gemm: Optional[Callable[..., Optional[Callable]]] = None,
                offload: Optional[Offload] = None) -> MemoryPlan:
    """The memory plan of `sched` (its in-place plan already in `sched.graph.storage`).
    `params`: per kernel, the buffers it takes; `keep`: keep the buffers that never leave the
    wrapper across calls; `tensors`: kernels take tensors (Triton), not data pointers; `gemm`:
    per mm/addmm call, a function the wrapper runs instead of ATen's out= form, or None;
    `offload`: buffers moved to host and back (no buffers are kept then)."""
    w = walk(sched, params, gemm, offload)
    kept, arena = plan_kept(sched, w, params, tensors) if keep and not offload else ((), 0)
    g = sched.graph
    return MemoryPlan(w.events, w.forms, tuple(g.storage.items()), kept, arena,
                      tuple((b, g.buffers[b].nbytes) for b in g.inputs), offload or None,
                      offloaded_outputs(g, offload),
                      tuple(t for t, b in g.offloadable if offload and b in offload.inners))


def peak_rows(plan: MemoryPlan, sched: Schedule, top: int = 12) -> list[tuple]:
    """The largest buffers live at the planned peak: (name, shape, dtype, bytes, graph nodes
    that made it), for the wrapper's header and explain()."""
    g = sched.graph
    made = {n.name: n.origins for it in sched.items if isinstance(it, Kernel) for n in it.nodes}
    made.update({o: (c.origin,) for c in sched.items if isinstance(c, CallNode)
                 for o in c.outputs if o is not None})
    rows = sorted(((g.buffers[n].nbytes, n) for n in plan.at_peak), reverse=True)
    return [(n, tuple(g.buffers[n].shape), str(g.buffers[n].dtype), nb,
             tuple(made.get(n, ()))) for nb, n in rows[:top]]
