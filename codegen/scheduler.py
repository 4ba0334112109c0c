"""LoweredGraph -> Schedule: compute nodes grouped into kernels, in a valid program order.

A kernel runs `for o in outer: for each loop: for r in loop.inner: steps`; a node joins a
kernel when its iteration space splits as outer x inner, every value it reads from the kernel
was produced in the same outer iteration, and the join saves memory traffic.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Optional, Union

import sympy

from trainc.codegen import dumps, ir, reshape
from trainc.codegen.graph import Buffer, CallNode, ComputeNode, LoweredGraph, TensorArg
from trainc.codegen import KernelInfo
from trainc.codegen.symbols import Indirect, Symbols

SERIAL_LIMIT = 1 << 16  # a kernel with no outer parallelism may hold at most this many elements
# A node joins a kernel at most this many program steps after the kernel's latest node, unless
# its result is small or takes over a buffer in place: joining computes the result early, so
# its buffer would stay alive across everything in between (in a whole training step, a
# backward value fused into a forward kernel lives from the forward to the backward).
JOIN_WINDOW = 16
SMALL_RESULT = 1 << 16  # bytes
# A node of at least LARGE_NODE elements joins a kernel only to save at least TINY_SAVING bytes
# of traffic. Sharing only scalars (an optimizer's lr and betas) saves a launch, not traffic, and
# can starve the node of parallelism (a large AdamW update inside a column reduction's few
# programs; BENCHMARKS.md).
LARGE_NODE = 1 << 20  # elements
TINY_SAVING = 1 << 10  # bytes
# The same holds for a node with INNER_HEAVY times more elements than a reduction kernel's
# outputs: it would run in the kernel's inner loops.
INNER_HEAVY = 64
# Independent small nodes (each moving at most SMALL_NODE bytes) share one kernel while it moves
# at most SMALL_KERNEL bytes, when everything they read exists before the kernel: the per-layer
# BatchNorm num_batches_tracked updates, the finishing stages of sibling split reductions. Each
# kernel costs a launch (~10 us of host time on CUDA, an OpenMP region on CPU) for microseconds
# of work.
SMALL_NODE = 1 << 18  # bytes
SMALL_KERNEL = 1 << 20  # bytes


@dataclass
class Loop:
    inner: tuple[int, ...]
    steps: list[ComputeNode]


@dataclass
class Kernel:
    name: str
    outer: Optional[tuple[int, ...]]  # None while the kernel holds only same-shape pointwise
    nodes: list[ComputeNode] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    local: set[str] = field(default_factory=set)  # buffers that never reach memory
    # local buffers read by a later loop of the same outer iteration: the backend keeps one
    # outer iteration of them in a small per-thread array (subset of `local`)
    scratch: set[str] = field(default_factory=set)
    info: Optional[KernelInfo] = None
    # nodes that joined viewed in another shape (codegen/reshape.py): the layout the kernel
    # indexes their buffer by; the wrapper still allocates and passes the buffer as lowered
    layouts: dict[str, Buffer] = field(default_factory=dict)

    def layout(self, buf: str, g: LoweredGraph) -> Buffer:
        """How this kernel indexes `buf`: a reshaped node's view of it, else the buffer."""
        return self.layouts.get(buf) or g.buffers[buf]

    @property
    def kind(self) -> str:
        return "scatter" if self.nodes[0].kind == "scatter" else "loops"


Item = Union[Kernel, CallNode]


@dataclass
class Schedule:
    items: list[Item]
    graph: LoweredGraph

    def __str__(self) -> str:
        return dumps.schedule_text(self)


def reads(node: ComputeNode, g: LoweredGraph) -> list[ir.Load]:
    """Every load of a compute node, over symbols of g's scope (computed once per node)."""
    cached = node.__dict__.get("_reads")
    if cached is None:
        cached = node.__dict__["_reads"] = _reads(node, g.symbols)
    return cached


def _reads(node: ComputeNode, syms: Symbols) -> list[ir.Load]:
    if node.kind == "pointwise":
        return ir.loads(node.fn(syms.shared("c", node.shape)))
    if node.kind == "reduction":
        return ir.loads(node.fn(syms.shared("c", node.shape), syms.shared("cr", node.rshape)))
    v = syms.shared("cr", node.rshape)
    out = ir.loads(node.init(syms.shared("c", node.shape))) + ir.loads(node.fn(v))
    for s in node.index(v).free_symbols:
        if isinstance(s, Indirect):
            out += ir.loads(s.value)
    return out


class _Builder:
    def __init__(self, g: LoweredGraph):
        self.g = g
        self.items: list[Item] = []
        self.producer: dict[str, int] = {}  # buffer -> item index
        self.deps: list[set[int]] = []  # item -> items it reads from directly
        self.reads: dict[int, set[str]] = {}  # item -> buffers its nodes read
        self.readers: dict[str, set[int]] = {}  # buffer -> items reading it (self.reads inverted)
        self.n_kernels = 0
        self.layouts: dict[str, Buffer] = {}  # reshaped nodes' buffers as kernels index them
        self.hinted = set(g.reuse) | set(g.reuse.values())
        self.unbound = _feeds_outputs(g)
        self.step = 0  # program position of the step being added
        self.last: dict[int, int] = {}  # kernel item -> position of its latest node
        self.small: Optional[int] = None  # the latest kernel of only small nodes
        self.small_bytes = 0  # bytes its nodes move

    def add_call(self, c: CallNode) -> None:
        self.step += 1
        bufs = set(_call_buffers(c))
        k = self._new_item(c, bufs, c.outputs)
        self.deps[k] |= {self.producer[b] for b in c.after if b in self.producer}

    def _new_item(self, item: Item, bufs: set[str], outs) -> int:
        k = len(self.items)
        self.items.append(item)
        self.deps.append({self.producer[b] for b in bufs if b in self.producer})
        self.reads[k] = set(bufs)
        self._note_reads(k, bufs)
        for o in outs:
            if o is not None:
                self.producer[o] = k
        return k

    def add_node(self, n: ComputeNode) -> None:
        self.step += 1
        loads = reads(n, self.g)
        bufs = {l.buf for l in loads}
        best, best_score = None, 0
        moved = sum(self.g.buffers[b].nbytes for b in bufs) + self.g.buffers[n.name].nbytes
        small = self._small_kernel(moved, bufs)
        if n.kind != "scatter":
            for k in self._candidates(bufs) + ([small] if small is not None else []):
                # sharing nothing, a small kernel still saves a launch (scored below any traffic)
                score = self._score(k, bufs) or (1 if k == small else 0)
                least = TINY_SAVING if self._starves(k, n) else 1
                if score >= least and score > best_score:
                    fit = self._legal(k, n)
                    if fit is not None:
                        best, best_score, joining = k, score, fit
        if best is not None and joining[0] is not n:
            n = self._reshape(n, *joining)
        if best is None:
            kern = Kernel(f"kernel{self.n_kernels}", None)
            self.n_kernels += 1
            for _ in range(3 if self._reshapeable(n) else 0):  # a split can expose another
                refined = reshape.refined_shape(n, self.g.symbols)
                fit = refined and reshape.reshaped(n, refined, self._layout(n.name))
                if not fit:
                    break
                n = self._reshape(n, *fit)
            if n.name in self.layouts:
                kern.layouts[n.name] = self.layouts[n.name]
            if n.kind == "reduction":
                kern.outer = n.shape
            kern.nodes.append(n)
            k = self._new_item(kern, bufs, [n.name])
            self.last[k] = self.step
            if moved <= SMALL_NODE and kern.kind == "loops":  # a scatter kernel runs only its node
                self.small, self.small_bytes = k, moved
            return
        kern = self.items[best]
        if best == self.small:
            self.small_bytes += moved
            if moved > SMALL_NODE:
                self.small = None
        if n.name in self.layouts:
            kern.layouts[n.name] = self.layouts[n.name]
        self.last[best] = self.step
        self._join(kern, n)
        self.deps[best] |= {self.producer[b] for b in bufs if b in self.producer} - {best}
        self.reads[best] |= bufs
        self._note_reads(best, bufs)
        self.producer[n.name] = best

    def _note_reads(self, k: int, bufs: set[str]) -> None:
        for b in bufs:
            self.readers.setdefault(b, set()).add(k)

    def _small_kernel(self, moved: int, bufs: set[str]) -> Optional[int]:
        """The small kernel a node moving `moved` bytes and reading `bufs` may share a launch
        with, if any: never one made before some of those inputs (it would have to wait)."""
        k = self.small
        if k is None or moved > SMALL_NODE or self.small_bytes + moved > SMALL_KERNEL \
                or any(self.producer.get(b, -1) > k for b in bufs):
            return None
        return k

    def _starves(self, k: int, n: ComputeNode) -> bool:
        """Would n, joined to kernel k, lose parallelism (see LARGE_NODE, INNER_HEAVY)?"""
        numel, outer = ir_numel(n.shape), self.items[k].outer
        return numel >= LARGE_NODE or (
            outer is not None and numel >= INNER_HEAVY * max(ir_numel(outer), 1))

    def _candidates(self, bufs: set[str]) -> list[int]:
        out = {self.producer[b] for b in bufs if b in self.producer}
        for b in bufs:
            out |= self.readers.get(b, set())
        return sorted(k for k in out if isinstance(self.items[k], Kernel)
                      and self.items[k].kind == "loops")

    def _score(self, k: int, bufs: set[str]) -> int:
        """Bytes of memory traffic the join saves: reads served by the kernel's own results or
        shared with its other nodes."""
        return sum(self.g.buffers[b].nbytes for b in bufs
                   if self.producer.get(b) == k or b in self.reads[k])

    def _legal(self, k: int, n: ComputeNode) -> Optional[tuple]:
        """(n, None) when n may join kernel k, (n viewed in another shape, its buffer's layout
        there) when it may join so reshaped, else None."""
        kern = self.items[k]
        if kern.nodes and kern.nodes[0].region != n.region and not self._updates_input(n):
            return None
        if self.step - self.last[k] > JOIN_WINDOW and n.name not in self.g.reuse \
                and n.name not in self.unbound and self.g.buffers[n.name].nbytes > SMALL_RESULT:
            return None
        fit: Optional[tuple] = (n, None)
        outer = _join_outer(kern, n)
        if outer is False:
            shape = reshape.target_shape(kern, n) if self._reshapeable(n) else None
            fit = None if shape is None else reshape.reshaped(n, shape, self._layout(n.name))
            if fit is None:
                return None
            outer = _join_outer(kern, fit[0])
            if outer is False:
                return None
        for b in {l.buf for l in reads(n, self.g)}:
            p = self.producer.get(b)
            if p is not None and p != k and self._reaches(p, k):
                return None  # n needs something that itself needs this kernel: a cycle
        return fit if _reads_ok(kern, fit[0], outer, self.g) else None

    def _updates_input(self, n: ComputeNode) -> bool:
        """n writes a graph input in place (an optimizer update of a parameter or its state):
        run early, it keeps nothing alive and frees the gradient it reads, so it may join a
        kernel of an earlier region."""
        target = self.g.reuse.get(n.name)
        return target is not None and self.g.buffers[target].kind == "input"

    def _reshapeable(self, n: ComputeNode) -> bool:
        """In-place hints pair buffers of equal shapes: a reshaped one would lose its pair."""
        return n.name not in self.hinted

    def _layout(self, buf: str) -> Buffer:
        return self.layouts.get(buf) or self.g.buffers[buf]

    def _reshape(self, n: ComputeNode, m: ComputeNode, buf: Buffer) -> ComputeNode:
        """From now on n is computed (and its buffer indexed by kernels) in m's shape."""
        self.layouts[n.name] = buf
        self.g.steps[next(i for i, x in enumerate(self.g.steps) if x is n)] = m
        return m

    def _reaches(self, start: int, target: int) -> bool:
        """Does item `start` depend (transitively) on item `target`?"""
        stack, seen = [start], set()
        while stack:
            x = stack.pop()
            if x == target:
                return True
            if x in seen:
                continue
            seen.add(x)
            stack.extend(self.deps[x])
        return False

    def _join(self, kern: Kernel, n: ComputeNode) -> None:
        if kern.kind != "loops":  # a scatter kernel's code runs only its own node
            raise AssertionError(f"trainc scheduler: {n.name} joined scatter kernel {kern.name}")
        kern.outer = _join_outer(kern, n)
        kern.nodes.append(n)


def _feeds_outputs(g: LoweredGraph) -> set[str]:
    """Graph outputs and the computed values only they (transitively) read: these live to the
    graph's end anyway (or only until their readers, which may join with them), so joining an
    earlier kernel outside the join window keeps nothing extra alive across the graph
    (a forward's saved values, computed at its end, join the kernels that read their inputs)."""
    out = {a.buf for a in g.outputs if isinstance(a, TensorArg)}
    readers: dict[str, list] = {}
    for step in g.steps:
        names = _call_buffers(step) if isinstance(step, CallNode) else \
            {l.buf for l in reads(step, g)}
        for b in names:
            readers.setdefault(b, []).append(step)
    for step in reversed(g.steps):
        if isinstance(step, ComputeNode) and step.name not in out:
            rs = readers.get(step.name, [])
            if rs and all(isinstance(r, ComputeNode) and r.name in out for r in rs):
                out.add(step.name)
    return out


def _join_outer(kern: Kernel, n: ComputeNode):
    """The kernel's outer dims after n joins, or False when n's space does not split."""
    first = kern.nodes[0]
    if kern.outer is None:
        if n.kind == "pointwise":
            return None if n.shape == first.shape else False
        o = n.shape
        if tuple(first.shape[:len(o)]) != tuple(o):
            return False
        if ir_numel(o) <= 1 and ir_numel(first.shape) > SERIAL_LIMIT:
            return False
        return tuple(o)
    o = kern.outer
    if n.kind == "pointwise":
        return o if tuple(n.shape[:len(o)]) == o else False
    return o if tuple(n.shape) == o else False


def ir_numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def inner_of(n: ComputeNode, outer: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n.rshape) if n.kind == "reduction" else tuple(n.shape[len(outer):])


def _reads_ok(kern: Kernel, n: ComputeNode, outer, g: LoweredGraph) -> bool:
    """Every load n makes of a buffer the kernel produces stays within one outer iteration."""
    produced = {m.name: m for m in kern.nodes}
    if not any(l.buf in produced for l in reads(n, g)):
        return True
    if outer is None:  # same-shape pointwise: only same-position reads
        syms = g.symbols.shared("s", n.shape)
        for l in ir.loads(n.fn(syms)):
            if l.buf in produced:
                b = kern.layout(l.buf, g)
                if l.index - ir.linear(syms, b.stride) != 0:
                    return False
        return True
    osyms = g.symbols.shared("o", outer)
    isyms = g.symbols.shared("i", inner_of(n, outer))
    e = n.fn(osyms + isyms) if n.kind == "pointwise" else n.fn(osyms, isyms)
    for l in ir.loads(e):
        if l.buf not in produced:
            continue
        b = kern.layout(l.buf, g)
        if within_outer(l.index, osyms, b.stride, b.shape) is None:
            return False
    return True


def within_outer(index, osyms, stride, shape) -> Optional[sympy.Expr]:
    """The inner offset h when `index` = lin(o) + h with 0 <= h < inner size, else None."""
    inner = ir_numel(shape[len(osyms):])
    h = index - ir.linear(osyms, stride[:len(osyms)])
    free = h.free_symbols
    if any(s in free for s in osyms) or any(isinstance(s, Indirect) for s in free):
        return None
    lo, hi = ir.bounds(h)
    if lo < 0 or hi >= inner:
        return None
    return h


def schedule(g: LoweredGraph, scratch_bytes: int = 0, min_inner: int = 1,
             register_row: int = 0) -> Schedule:
    """`scratch_bytes`: the most bytes per outer iteration a kernel-internal buffer may take to
    live in per-thread scratch instead of memory (0: never; backends opt in). `min_inner`: a
    pointwise-only kernel moves trailing dims into its inner loops until they hold this many
    elements (long vector loops for backends that can flatten them). `register_row`: a kernel
    whose rows (padded to a power of two) hold at most this many elements keeps a whole row in
    registers (Triton's persistent tiles): a value a later loop reads only at the position it
    was computed at never reaches memory (0: never)."""
    b = _Builder(g)
    for step in g.steps:
        if isinstance(step, CallNode):
            b.add_call(step)
        else:
            b.add_node(step)
    order = _sink_input_readers(_topo(b.deps), b)
    items = [b.items[k] for k in order]
    outside = _outside_reads(b, g)
    for k in order:
        if isinstance(b.items[k], Kernel):
            plan(b.items[k], g, outside.get(k, set()), scratch_bytes, min_inner, register_row)
    return Schedule(items, g)


def _outside_reads(b: _Builder, g: LoweredGraph) -> dict[int, set[str]]:
    """Per kernel: its buffers that something outside it (or the graph output) reads."""
    out: dict[int, set[str]] = {}
    returned = {a.buf for a in g.outputs if hasattr(a, "buf")}
    for k, bufs in b.reads.items():
        for buf in bufs:
            p = b.producer.get(buf)
            if p is not None and p != k:
                out.setdefault(p, set()).add(buf)
    for buf in returned:
        if buf in b.producer:
            out.setdefault(b.producer[buf], set()).add(buf)
    return out


def plan(kern: Kernel, g: LoweredGraph, needed_outside: set[str],
         scratch_bytes: int = 0, min_inner: int = 1, register_row: int = 0) -> None:
    """Split the kernel's nodes into loops, find kernel-local buffers, count bytes."""
    if kern.outer is None:
        shape = kern.nodes[0].shape
        k = max(len(shape) - 1, 0)
        while k > 0 and ir_numel(shape[k:]) < min_inner:
            k -= 1
        kern.outer = tuple(shape[:k]) if kern.kind == "loops" else ()
    if kern.kind == "scatter":
        kern.outer = ()
        kern.loops = [Loop((), list(kern.nodes))]
    else:
        kern.loops = _merge_loops(kern, g)
    loop_of = {n.name: i for i, lp in enumerate(kern.loops) for n in lp.steps}
    users: dict[str, set[int]] = {}
    for i, lp in enumerate(kern.loops):
        for n in lp.steps:
            for l in reads(n, g):
                users.setdefault(l.buf, set()).add(i)
    for n in kern.nodes:
        if n.name in needed_outside or n.kind == "scatter":
            continue
        if n.kind == "reduction" or users.get(n.name, set()) <= {loop_of[n.name]}:
            kern.local.add(n.name)
        elif _scratch_ok(kern, n, g, scratch_bytes) or \
                _register_ok(kern, n, g, loop_of, register_row):
            kern.local.add(n.name)
            kern.scratch.add(n.name)
    produced = {n.name for n in kern.nodes}
    read = {l.buf for n in kern.nodes for l in reads(n, g)} - produced
    written = produced - kern.local
    kern.info = KernelInfo(kern.name, tuple(o for n in kern.nodes for o in n.origins),
                           sum(g.buffers[b].nbytes for b in read),
                           sum(g.buffers[b].nbytes for b in written))


def _scratch_ok(kern: Kernel, n: ComputeNode, g: LoweredGraph, limit: int) -> bool:
    """n's values of one outer iteration fit in `limit` bytes and every read of n in the kernel
    stays inside that outer iteration (so a per-thread array can stand in for the buffer)."""
    if n.kind != "pointwise" or not kern.outer:
        return False
    b = kern.layout(n.name, g)
    inner = ir_numel(n.shape[len(kern.outer):])
    if inner * b.dtype.itemsize > limit:
        return False
    osyms = g.symbols.ranges("o", kern.outer)
    isyms = g.symbols.ranges("i", n.shape[len(kern.outer):])
    if within_outer(ir.linear(osyms + isyms, b.stride), osyms, b.stride, b.shape) is None:
        return False
    for m in kern.nodes:
        isyms = g.symbols.ranges("i", inner_of(m, kern.outer))
        e = m.fn(osyms + isyms) if m.kind == "pointwise" else m.fn(osyms, isyms)
        for l in ir.loads(e):
            if l.buf == n.name and within_outer(l.index, osyms, b.stride, b.shape) is None:
                return False
    return True


def _register_ok(kern: Kernel, n: ComputeNode, g: LoweredGraph, loop_of: dict,
                 register_row: int) -> bool:
    """A row of every loop fits `register_row` (a power of two: one tile holds the row) and
    each loop reading n runs over n's inner space and reads n only where n was computed."""
    if not register_row or n.kind != "pointwise" or not kern.outer:
        return False
    if max(ir_numel(lp.inner) for lp in kern.loops) > register_row:
        return False
    home = kern.loops[loop_of[n.name]]
    osyms = g.symbols.ranges("o", kern.outer)
    isyms = g.symbols.ranges("i", home.inner)
    here = ir.linear(osyms + isyms, kern.layout(n.name, g).stride)
    for lp in kern.loops:
        for m in lp.steps:
            if lp.inner != home.inner:
                if any(l.buf == n.name for l in reads(m, g)):
                    return False
                continue
            e = m.fn(osyms + isyms) if m.kind == "pointwise" else m.fn(osyms, isyms)
            if any(l.buf == n.name and l.index - here != 0 for l in ir.loads(e)):
                return False
    return True


def _merge_loops(kern: Kernel, g: LoweredGraph) -> list[Loop]:
    loops: list[Loop] = []
    osyms = g.symbols.ranges("o", kern.outer)
    for n in kern.nodes:
        inner = inner_of(n, kern.outer)
        if loops and loops[-1].inner == inner and _same_loop_ok(kern, loops[-1], n, osyms, g):
            loops[-1].steps.append(n)
        else:
            loops.append(Loop(inner, [n]))
    return loops


def _same_loop_ok(kern: Kernel, loop: Loop, n: ComputeNode, osyms, g: LoweredGraph) -> bool:
    """n may share the loop when it reads the loop's results only at the position it is at."""
    here = {m.name: m for m in loop.steps}
    isyms = g.symbols.ranges("i", loop.inner)
    e = n.fn(osyms + isyms) if n.kind == "pointwise" else n.fn(osyms, isyms)
    for l in ir.loads(e):
        m = here.get(l.buf)
        if m is None:
            continue
        if m.kind != "pointwise":
            return False
        if l.index - ir.linear(osyms + isyms, kern.layout(l.buf, g).stride) != 0:
            return False
    return True


def _topo(deps: list[set[int]]) -> list[int]:
    users: list[list[int]] = [[] for _ in deps]
    missing = [len(d) for d in deps]
    for k, d in enumerate(deps):
        for p in d:
            users[p].append(k)
    ready = [k for k, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        k = heapq.heappop(ready)
        out.append(k)
        for u in users[k]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, u)
    assert len(out) == len(deps), "trainc: fusion produced a dependency cycle"
    return out


def _sink_input_readers(order: list[int], b: _Builder) -> list[int]:
    """A kernel that reads only graph inputs runs just before its first user, not first in the
    program: the host issues the step's first large kernels sooner (the GPU idles until then),
    and its outputs live shorter. Lowering puts one-element values of inputs first (an AdamW
    step's bias corrections, `graph._realize_scalar`) so that the updates reading them may join
    the gradients' kernels; their kernel (and the upload of the CPU step counts it reads) now
    launches in the backward, while the GPU is busy. A kernel reading an input some result
    may overwrite in place (a reuse hint) stays where it is: plan_storage would refuse the
    hint once a reader follows the write."""
    users: dict[int, int] = {}
    for pos, k in enumerate(order):
        for d in b.deps[k]:
            users.setdefault(d, pos)
    hinted = set(b.g.reuse.values())
    before: dict[int, list[int]] = {}  # position of a first user -> kernels moved there
    for k in order:
        if not b.deps[k] and isinstance(b.items[k], Kernel) and k in users \
                and not (b.reads[k] & hinted):
            before.setdefault(users[k], []).append(k)
    moved = {k for ks in before.values() for k in ks}
    out = []
    for pos, k in enumerate(order):
        out.extend(before.get(pos, ()))
        if k not in moved:
            out.append(k)
    return out


def _call_buffers(c: CallNode) -> list[str]:
    from trainc.codegen.graph import TensorArg
    out = []

    def visit(a):
        if isinstance(a, TensorArg):
            out.append(a.buf)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
    visit(c.args)
    visit(list(c.kwargs.values()))
    return out
