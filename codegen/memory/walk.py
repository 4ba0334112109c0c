"""Schedule -> memory events, in the order the wrapper runs them.

A buffer dies after its last reader; a dead buffer the wrapper allocated is reused for the next
allocation of the same element count and dtype (never graph outputs); an in-place result the
in-place plan (inplace.py) accepted takes its target's storage. Per schedule item the events are
its allocations (alloc, reuse, inplace, aten) then its frees (pool, free, drop). With an
Offload (offload.py), a forward output moved to host is copied after the item making it
(offload) and freed like any other buffer once its copy is estimated done; a backward input
arriving on the host is copied back before an item (prefetch: allocated then) and waited for
before its first reader (ready). A buffer moved within the graph (compile_step's) does both: its
copy out after the item making it, a free after its early readers, its copy back (a prefetch
from its host copy) before its later ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from trainc.codegen.graph import Buffer, CallNode, LoweredGraph, TensorArg
from trainc.codegen.ir import contiguous_strides
from trainc.codegen.memory.inplace import out_variant
from trainc.codegen.memory.offload import Offload
from trainc.codegen.scheduler import Kernel, Schedule, _call_buffers

MAKES = ("alloc", "reuse", "inplace", "aten")  # events before an item runs; the rest after it
LOADS = ("prefetch", "ready")  # before an item too, ahead of its inputs' layout checks


@dataclass(frozen=True)
class Event:
    """One step of the wrapper's memory. kind: alloc (a fresh buffer the wrapper allocates),
    reuse (a pooled dead buffer `src` taken over), inplace (the storage of `src`, which the
    item overwrites), aten (a result ATen allocates), pool (dead, held for a reuse next),
    free (`del` after the last use), drop (`del` of a target whose storage a result took)."""
    item: int  # position in the schedule
    # kinds: MAKES, LOADS, then "offload" (a copy to host started) and the frees below
    kind: str
    buf: str
    delta: int = 0  # bytes added to (+) or freed from (-) the planned live total
    src: str = ""

    def __str__(self) -> str:
        src = f" <- {self.src}" if self.src else ""
        delta = f"{self.delta:+d}" if self.delta else ""
        return f"item {self.item:4d}  {self.kind:7s} {self.buf + src:22s} {delta:>12s}"


@dataclass(frozen=True)
class Walk:
    events: tuple[Event, ...]
    forms: tuple[str, ...]  # per item: "kernel", or how a call runs: "inplace" | "out" | "aten"
    root: dict  # name -> the allocation (or input) whose storage it uses, where not its own


def reads(item, params: dict[str, list[str]]) -> list[str]:
    """Buffers the item touches; what it produces counts too, so a result nobody reads (or one
    stored under its target's name, in place) dies right after it."""
    if isinstance(item, Kernel):
        made = [n.name for n in item.nodes if n.name not in item.local]
        return list(dict.fromkeys(list(params[item.name]) + made))
    return _call_buffers(item) + [o for o in item.outputs if o is not None]


def pool_key(b: Buffer) -> tuple:
    return (b.nbytes, b.dtype, b.stride == contiguous_strides(b.shape))


def walk(sched: Schedule, params: dict[str, list[str]],
         gemm: Optional[Callable[..., Optional[Callable]]] = None,
         offload: Optional[Offload] = None) -> Walk:
    """The events of running `sched` (params: per kernel, the buffers it takes; gemm: the
    backend's per-call replacement for ATen's mm, which then allocates its own result;
    offload: buffers moved to host and back)."""
    w = _Walker(sched, params, gemm or (lambda call, inplace=False: None), offload or Offload())
    for k, item in enumerate(sched.items):
        w.item(k, item)
    return Walk(tuple(w.events), tuple(w.forms), w.root)


class _Walker:
    def __init__(self, sched: Schedule, params: dict[str, list[str]], gemm: Callable,
                 offload: Offload):
        self.s, self.g, self.params, self.gemm = sched, sched.graph, params, gemm
        self.events: list[Event] = []
        self.forms: list[str] = []
        self.pool: dict[tuple, list[str]] = {}
        self.ours: set[str] = set()  # buffers the wrapper allocated (safe to reuse)
        self.storage = dict(sched.graph.storage)  # in-place result -> buffer it overwrites
        self.claimed = set(self.storage.values())
        self.drop: list[str] = []  # overwritten targets whose names die after this item
        self.root: dict[str, str] = {}
        self.last = _last_uses(sched, params)
        self.keep = {a.buf for a in self.g.outputs if isinstance(a, TensorArg)}
        # A fallback op may return a view of its input: such buffers are freed, never reused.
        self.no_pool = {b for it in sched.items if isinstance(it, CallNode) and
                        it.kind == "fallback" for b in reads(it, params)}
        self.wanted = self._future_allocs()
        # offloads: a saved buffer leaves as its host copy, is never pooled (its copy may still
        # read it) and dies after its last reader or its copy's estimated end, whichever is later
        self.saves = offload.saves
        self.keep -= set(self.saves)
        self.no_pool |= set(self.saves)
        self.late_dead: dict[int, set[str]] = {}
        for b, done in self.saves.items():
            self.last[b] = max(self.last.get(b, 0), done)
            self.late_dead.setdefault(self.last[b], set()).add(b)
        self.loads = offload.loads
        self.issues: dict[int, list[tuple[str, str]]] = {}  # item -> (buffer, its host copy)
        self.readies: dict[int, list[str]] = {}
        for b, (p, u) in self.loads.items():
            self.issues.setdefault(p, []).append((b, ""))
            self.readies.setdefault(u, []).append(b)
        self.inners = offload.inners
        self.no_pool |= set(self.inners)
        self.early_dead: dict[int, list[str]] = {}
        for b, (f, p, u) in self.inners.items():
            self.early_dead.setdefault(f, []).append(b)
            self.issues.setdefault(p, []).append((b, b + "__host"))
            self.readies.setdefault(u, []).append(b)

    def item(self, k: int, item) -> None:
        self.events += [Event(k, "prefetch", b, self.g.buffers[b].nbytes, host)
                        for b, host in self.issues.get(k, ())]
        self.events += [Event(k, "ready", b) for b in self.readies.get(k, ())]
        if isinstance(item, Kernel):
            self.forms.append("kernel")
            for n in item.nodes:
                if n.name not in item.local:
                    self.alloc(k, n.name)
        else:
            self._call(k, item)
        made = [n.name for n in item.nodes] if isinstance(item, Kernel) else item.outputs
        self.events += [Event(k, "offload", b) for b in made
                        if b in self.saves or b in self.inners]
        self.free(k, item)

    def _call(self, k: int, c: CallNode) -> None:
        if c.inplace is not None and c.outputs and c.outputs[0] in self.storage:
            self.forms.append("inplace")
            self.take(k, c.outputs[0])
        elif out_variant(c, self.gemm) is not None:
            self.forms.append("out")
            self.alloc(k, c.outputs[0])
        else:
            self.forms.append("aten")
            for o in c.outputs:
                if o is not None:
                    self.events.append(Event(k, "aten", o, self.g.buffers[o].nbytes))

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
            ours = [pool_key(self.g.buffers[b]) for b in self._allocates(item)]
            theirs = [] if isinstance(item, Kernel) or ours else \
                [None for o in item.outputs if o is not None and o not in self.storage]
            run = ours + theirs + run
        return out

    def _allocates(self, item) -> list[str]:
        if isinstance(item, Kernel):
            names = [n.name for n in item.nodes if n.name not in item.local]
        elif out_variant(item, self.gemm) is not None:
            names = [item.outputs[0]]
        else:
            names = []
        return [b for b in names if b not in self.storage]

    def alloc(self, k: int, name: str) -> None:
        b: Buffer = self.g.buffers[name]
        if name in self.storage:
            self.take(k, name)
            return
        key = pool_key(b)
        if key[2] and self.pool.get(key):
            old = self.pool[key].pop()
            self.root[name] = self.root.get(old, old)
            self.events.append(Event(k, "reuse", name, 0, old))
        else:
            self.events.append(Event(k, "alloc", name, b.nbytes))
        self.ours.add(name)

    def take(self, k: int, name: str) -> None:
        """`name` lives in the storage of the buffer its in-place op overwrote."""
        target = self.storage[name]
        self.root[name] = self.root.get(target, target)
        self.events.append(Event(k, "inplace", name, 0, target))
        if target in self.ours:
            self.ours.add(name)
        self.drop.append(target)

    def free(self, k: int, item) -> None:
        # inputs too: run() empties its argument list, so a saved activation the caller handed
        # over (the backward's) is freed after its last use, not when the backward returns
        near = set(reads(item, self.params)) | self.late_dead.get(k, set())
        dead = sorted({b for b in near if self.last.get(b) == k} - self.keep
                      - set(self.g.consts) - self.claimed)
        for b in dead:
            buf = self.g.buffers[b]
            key = pool_key(buf)
            pooled = self.pool.setdefault(key, [])
            if b in self.ours and b not in self.no_pool and \
                    len(pooled) < self.wanted[k].get(key, 0):
                pooled.append(b)
                self.events.append(Event(k, "pool", b))
            else:
                frees = buf.kind in ("compute", "call") and not _overwrote(
                    self.g, self.storage, b) or b in self.loads
                self.events.append(Event(k, "free", b, -buf.nbytes if frees else 0))
        self.events += [Event(k, "free", b, -self.g.buffers[b].nbytes)
                        for b in self.early_dead.get(k, ())]  # moved out; back before its reader
        self.events += [Event(k, "drop", t) for t in self.drop]
        self.drop = []


def _last_uses(sched: Schedule, params: dict[str, list[str]]) -> dict[str, int]:
    last: dict[str, int] = {}
    for k, item in enumerate(sched.items):
        for b in reads(item, params):
            last[b] = k
    return last


def _overwrote(g: LoweredGraph, storage: dict[str, str], b: str) -> bool:
    """b took the storage of a graph input: freeing the name frees no memory."""
    root = b
    while root in storage:
        root = storage[root]
    return root in g.inputs
