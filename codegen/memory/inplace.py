"""Schedule -> in-place plan: which in-place results (LoweredGraph.reuse hints) are computed
straight into the buffer their op overwrote. A hint is taken only when, in schedule order, nothing
reads the old buffer after the writer, and inside the writing kernel every read of it happens at
the written position before the write (reinplacing was decided on the FX graph, before fusion).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from trainc.codegen import ir
from trainc.codegen.graph import Buffer, CallNode, LoweredGraph, TensorArg
from trainc.codegen.scheduler import Kernel, Schedule, _call_buffers, reads, within_outer
from trainc.codegen.symbols import Indirect

aten = torch.ops.aten
# ATen calls the wrapper runs as their out= form, into a buffer it allocated (or took in place)
OUT_VARIANTS = {aten.mm.default: aten.mm.out, aten.addmm.default: aten.addmm.out,
                aten.bmm.default: aten.bmm.out}


def plan_storage(sched: Schedule, foreign: frozenset = frozenset()) -> dict[str, str]:
    """{buffer: buffer whose storage it takes}; also stored as `sched.graph.storage`.
    `foreign`: input buffers on another device than the kernels (CPU scalars such as Adam's
    step count in a CUDA graph): kernels see copies of them, so they are never written."""
    g = sched.graph
    producer: dict[str, int] = {}
    readers: dict[str, set[int]] = {}
    for k, item in enumerate(sched.items):
        if isinstance(item, Kernel):
            producer.update({n.name: k for n in item.nodes if n.name not in item.local})
            bufs = {l.buf for n in item.nodes for l in reads(n, g)}
        else:
            producer.update({o: k for o in item.outputs if o is not None})
            bufs = set(_call_buffers(item))
        for b in bufs:
            readers.setdefault(b, set()).add(k)
    unsafe = {a.buf for a in g.outputs if isinstance(a, TensorArg)} | _view_aliased(sched)
    unsafe |= set(foreign)
    plan: dict[str, str] = {}
    taken: set[str] = set()
    for x, t in g.reuse.items():
        if t in taken or t in unsafe or x not in producer or not _same(g, x, t):
            continue
        if t not in producer and g.buffers[t].kind != "input":
            continue  # a kernel-local value or a constant: no storage of its own to take
        k = producer[x]
        if producer.get(t, -1) >= k or any(r > k for r in readers.get(t, ())):
            continue
        if t in producer and _idle_allocs(sched, max(readers.get(t, {producer[t]})), k):
            continue  # t would sit idle while others allocate: a fresh x peaks lower
        item = sched.items[k]
        ok = (_kernel_ok(item, x, t, g) if isinstance(item, Kernel)
              else _call_ok(item, t, k in readers.get(t, ())))
        if ok:
            plan[x] = t
            taken.add(t)
    g.storage = plan
    return plan


def _idle_allocs(sched: Schedule, last: int, k: int) -> bool:
    """Does anything allocate after t's last reader `last` and before x's producer `k`?"""
    for item in sched.items[last + 1:k]:
        if isinstance(item, Kernel):
            if any(n.name not in item.local for n in item.nodes):
                return True
        elif any(o is not None for o in item.outputs):
            return True
    return False


def _same(g: LoweredGraph, x: str, t: str) -> bool:
    a, b = g.buffers[x], g.buffers[t]
    return (a.shape, a.stride, a.dtype) == (b.shape, b.stride, b.dtype)


def _view_aliased(sched: Schedule) -> set[str]:
    """Buffers a fallback op may return a view of (or that are such views): never overwritten."""
    out: set[str] = set()
    for it in sched.items:
        if isinstance(it, CallNode) and it.kind == "fallback" and may_alias(it.target):
            out |= set(_call_buffers(it)) | {o for o in it.outputs if o is not None}
    return out


def out_variant(c: CallNode, gemm: Callable[..., Optional[Callable]]):
    """The out= op the call runs as, into a buffer the wrapper allocates, or None (keyword
    arguments, or a function `gemm` picked to run it instead)."""
    if c.kwargs or gemm(c) is not None:
        return None
    return OUT_VARIANTS.get(c.target)


def may_alias(target) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def _call_ok(c: CallNode, t: str, reads_t: bool) -> bool:
    """A call writes t's storage: an extern with an out= form that does not read t, or the
    in-place op a functional fallback stands for, writing t and reading it only there."""
    if c.kind == "extern":
        if c.target in OUT_VARIANTS and not c.kwargs and not reads_t:
            return True
        # addmm_ adding into its own `self` (a gradient into .grad): ATen allows out=self
        return c.target is aten.addmm.default and c.inplace is not None and \
            c.inplace[1] == 0 and _reads_only_as(c, t, 0)
    if c.inplace is None or len(c.outputs) != 1:
        return False
    key = c.inplace[1]
    if isinstance(key, str):
        return _call_buffers(c).count(t) == 0
    return _reads_only_as(c, t, key)


def _reads_only_as(c: CallNode, t: str, pos: int) -> bool:
    """The call reads t once, as its whole argument `pos`."""
    arg = c.args[pos] if pos < len(c.args) else None
    return _call_buffers(c).count(t) == 1 and isinstance(arg, TensorArg) and arg.buf == t \
        and arg.whole


def _kernel_ok(kern: Kernel, x: str, t: str, g: LoweredGraph) -> bool:
    if kern.kind == "scatter":
        return _scatter_ok(kern, t, g)
    where = [(i, j) for i, lp in enumerate(kern.loops) for j, n in enumerate(lp.steps)
             if n.name == x]
    if not where or any(n.name == t for n in kern.nodes):
        return False
    lx, jx = where[0]
    bt = g.buffers[t]
    osyms = g.symbols.ranges("o", kern.outer)
    for i, lp in enumerate(kern.loops):
        isyms = g.symbols.ranges("i", lp.inner)
        for j, n in enumerate(lp.steps):
            e = n.fn(osyms + isyms) if n.kind == "pointwise" else n.fn(osyms, isyms)
            for l in ir.loads(e):
                if l.buf == t and not _read_ok(l.index, (i, j), (lx, jx), osyms, isyms, bt):
                    return False
    return True


def _read_ok(index, at: tuple[int, int], write: tuple[int, int], osyms, isyms,
             bt: Buffer) -> bool:
    """A read of the old value at `index`, by step `at` (loop, position), when the new value is
    stored by step `write`: earlier loops may read anywhere in their own outer slice (other
    slices belong to other threads/programs), the writing loop only the written element and
    only up to the writer itself; later loops would see the new value."""
    if at[0] > write[0]:
        return False
    if at[0] < write[0]:
        return within_outer(index, osyms, bt.stride, bt.shape) is not None
    return at[1] <= write[1] and index - ir.linear(osyms + isyms, bt.stride) == 0


def _scatter_ok(kern: Kernel, t: str, g: LoweredGraph) -> bool:
    """A scatter may overwrite t when only its init reads t, element for element."""
    n = kern.nodes[0]
    v = g.symbols.ranges("v", n.rshape)
    later = ir.loads(n.fn(v)) + [l for s in n.index(v).free_symbols if isinstance(s, Indirect)
                                 for l in ir.loads(s.value)]
    if any(l.buf == t for l in later):
        return False
    s = g.symbols.ranges("s", n.shape)
    bt = g.buffers[t]
    return all(l.index - ir.linear(s, bt.stride) == 0
               for l in ir.loads(n.init(s)) if l.buf == t)
