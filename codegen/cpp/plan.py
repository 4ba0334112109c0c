"""Kernel -> KernelPlan: every choice the C++ printer makes about a kernel, made before any code
is printed, as data that prints itself. The printer (codegen/cpp/printer.py) only spells a plan.

A plan says which loop vectorizes (the innermost one, or lanes of the last outer dim,
codegen/cpp/lanes.py), which values are computed once before the loops (hoist.py) or kept for a
later loop (reuse.py), whether reduced dims split over threads (threads.py), which transposed
stores go through tiles (transpose.py), and which loops unroll. `CppTarget` holds the
thresholds these choices are made against.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional

import sympy

from trainc.codegen import ir
from trainc.codegen.cpp.hoist import Hoist, plan_hoists
from trainc.codegen.cpp.lanes import LANE_WIDTHS, choose_lanes, flatten_loop
from trainc.codegen.cpp.reductions import FOLDABLE
from trainc.codegen.cpp.reuse import Reuse, plan_reuse
from trainc.codegen.cpp.threads import SPLIT_MAX_THREADS
from trainc.codegen.cpp.transpose import tiled_stores
from trainc.codegen.graph import LoweredGraph
from trainc.codegen.scheduler import Kernel, Loop
from trainc.codegen.symbols import Symbols

PARALLEL_WORK = 32768  # elements a kernel must touch before OpenMP threads pay off
SCRATCH_BYTES = 16384  # per kernel-internal buffer and outer iteration: stays in L1/L2
MIN_INNER = 512  # elements a pointwise kernel's inner loops cover (flattened when contiguous)
UNROLL_LANES = 64  # accumulator lanes a lanes reduction loop keeps in flight
TINY_INNER = 4  # innermost pointwise dims this short are unrolled inside the next dim's loop


@dataclass(frozen=True)
class CppTarget:
    """What the C++ backend plans for: lane block widths, when threads pay off, how many
    accumulator lanes hide a vector add's latency, the tiny innermost dims worth unrolling, and
    the most threads a thread split uses."""
    lane_widths: tuple[int, ...] = LANE_WIDTHS
    parallel_work: int = PARALLEL_WORK
    unroll_lanes: int = UNROLL_LANES
    tiny_inner: int = TINY_INNER
    max_threads: int = SPLIT_MAX_THREADS
    # capabilities (codegen/target.py Target); oneDNN runs convolutions fastest channels-last
    tiles: bool = True
    channels_last: bool = True
    accumulates_grads: bool = True
    cuda_graphs: bool = False
    partition_objective: str = "balanced"  # Config.partition_objective: recompute costs on CPUs
    compile_workers: bool = False
    offloads: bool = False  # host memory is the device's

    @property
    def vector_lanes(self) -> tuple[int, ...]:
        return self.lane_widths

    def __str__(self) -> str:
        return (f"cpp target: lanes {'/'.join(map(str, self.lane_widths))}, parallel from "
                f"{self.parallel_work} elements, {self.unroll_lanes} accumulator lanes, tiny "
                f"inner <= {self.tiny_inner}, split <= {self.max_threads} threads")


CPU = CppTarget()


@dataclass(frozen=True)
class LoopPlan:
    """One inner loop of a kernel's outer iteration."""
    steps: tuple[str, ...]  # its nodes, reductions as "name=op"
    syms: tuple  # loop symbols (trailing dims merged where contiguous, lanes.flatten_loop)
    dims: tuple  # each inner dim's index expression over syms
    extents: tuple[int, ...]  # of syms
    vector: tuple  # (symbol, extent) the loop vectorizes along; (None, 0): none
    simd: bool  # `omp simd` on the innermost loop (argmax/argmin keep it scalar)
    tiny: int = 0  # innermost extent unrolled inside a vector loop over the next dim
    unroll: int = 1  # accumulator sets over the innermost reduced dim (lanes reductions)
    unroll_sym: Optional[sympy.Symbol] = None  # the innermost symbol when unrolled
    tiles: tuple[tuple[str, str], ...] = ()  # (node, store index): stored through a tile
    barrier: bool = False  # thread split: a later loop reads what this one stored

    def __str__(self) -> str:
        ext = "x".join(map(str, self.extents)) or "1"
        head = f"loop {ext} [{', '.join(s.name for s in self.syms)}]: {', '.join(self.steps)}"
        notes = []
        v, n = self.vector
        if v is not None:
            notes.append(f"vector {v.name}<{n}" + ("" if self.simd else " (no simd)"))
        if self.tiny:
            notes.append(f"tiny inner {self.tiny} unrolled")
        if self.unroll > 1:
            notes.append(f"unroll {self.unroll} ({self.unroll_sym.name})")
        if self.tiles:
            notes.append("tiles " + ", ".join(t for t, _ in self.tiles))
        if self.barrier:
            notes.append("barrier after")
        return head + ("; " + "; ".join(notes) if notes else "")


@dataclass(frozen=True)
class KernelPlan:
    """What the printer does to one kernel; `str()` is the summary TRAINC_DEBUG_DIR's
    42_kernels.txt lists."""
    name: str
    mode: str  # "inner" (vectorize the innermost loop) | "lanes" | "scatter"
    outer: tuple[int, ...]
    osyms: tuple  # the outer dims' symbols
    lanes: Optional[int] = None  # outer iterations a lane block runs side by side
    parallel: bool = False  # `omp parallel for` over the outer iterations
    split: bool = False  # reduced dims split over threads (one lane block)
    threads: int = 0  # most threads of a split
    loops: tuple[LoopPlan, ...] = ()
    hoists: tuple[Hoist, ...] = ()
    reuse: tuple[Reuse, ...] = ()
    # each node's value over the loop symbols, built once: the choices and the printer share it
    exprs: Mapping = field(default_factory=lambda: MappingProxyType({}), repr=False,
                           compare=False)
    scope: Optional[Symbols] = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        head = f"{self.name}: {self.mode}"
        if self.lanes:
            head += f" {self.lanes}"
        head += f", outer {'x'.join(map(str, self.outer)) or '1'}"
        if self.osyms:
            head += f" [{', '.join(s.name for s in self.osyms)}]"
        if self.parallel:
            head += ", parallel"
        if self.split:
            head += f", split over <= {self.threads} threads"
        lines = [head] + [f"  {lp}" for lp in self.loops]
        lines += [f"  hoist {h.name} = {brief(h.expr)} along {h.sym.name}<{h.extent}"
                  for h in self.hoists]
        lines += [f"  reuse {r.name} = {brief(r.expr)}: loop {r.first} -> "
                  f"{', '.join(map(str, r.later))}" for r in self.reuse]
        return "\n".join(lines)


def plan_kernel(kern: Kernel, g: LoweredGraph, target: CppTarget = CPU) -> KernelPlan:
    """The plan of kernel `kern` of graph `g` (makes the kernel's symbol scope in g's table)."""
    scope = g.symbols.kernel(kern.name)  # this kernel's own: its source is its own
    outer = tuple(int(e) for e in kern.outer or ())
    if kern.kind == "scatter":
        return KernelPlan(kern.name, "scatter", outer, (), scope=scope,
                          parallel=_numel(kern.nodes[0].shape) >= target.parallel_work)
    osyms = scope.ranges("o", kern.outer)
    plain: dict[tuple, list] = {}  # loops of equal extents share their per-dim symbols
    shapes = [flatten_loop(lp, osyms, g, kern.local,
                           plain.setdefault(tuple(lp.inner), scope.ranges("i", lp.inner)),
                           scope, kern.layouts)
              for lp in kern.loops]
    exprs = {n.name: n.fn(osyms + dims) if n.kind == "pointwise" else n.fn(osyms, dims)
             for lp, (_, dims, _) in zip(kern.loops, shapes) for n in lp.steps}
    values = [[exprs[n.name] for n in lp.steps] for lp in kern.loops]
    lanes = choose_lanes(kern, g, osyms, [s[0] for s in shapes], [s[1] for s in shapes], exprs,
                         target.lane_widths)
    reuse = [] if lanes else plan_reuse(values, [s[2] for s in shapes], [s[0] for s in shapes])
    tiny = [_tiny_inner(kern, lp, shape, bool(lanes or reuse), target)
            for lp, shape in zip(kern.loops, shapes)]
    vectors = [_vector_dim(osyms, outer, lanes, shape, t) for shape, t in zip(shapes, tiny)]
    hoists = plan_hoists(values, [v for v, _ in vectors], [n for _, n in vectors],
                         kernel_writes(kern, g))
    split = _thread_split(kern, lanes, bool(reuse), target)
    loops = tuple(_loop_plan(kern, g, k, osyms, shapes[k], vectors[k], tiny[k], lanes, split,
                             exprs, scope, target) for k in range(len(kern.loops)))
    parallel = bool(osyms) and _numel(outer) > 1 and not split and \
        work(kern) >= target.parallel_work
    return KernelPlan(kern.name, "lanes" if lanes else "inner", outer, tuple(osyms), lanes,
                      parallel, split, target.max_threads if split else 0, loops,
                      tuple(hoists), tuple(reuse), MappingProxyType(exprs), scope)


def _loop_plan(kern: Kernel, g: LoweredGraph, k: int, osyms, shape, vector, tiny: int,
               lanes: Optional[int], split: bool, exprs, scope: Symbols,
               target: CppTarget) -> LoopPlan:
    lp = kern.loops[k]
    isyms, dims, extents = shape
    unroll = _unroll(lp, lanes, isyms, extents, target)
    # made after every loop's own symbols: creation order fixes the printed source
    unroll_sym = scope.range("i", int(extents[-1]) // unroll) if unroll > 1 else None
    tiles = {} if not lanes or unroll > 1 or tiny or split else \
        tiled_stores(kern, g, lp, osyms, isyms, extents, dims)
    steps = tuple(n.name if n.kind == "pointwise" else f"{n.name}={n.reduce_op}"
                  for n in lp.steps)
    simd = not any(n.reduce_op in ("argmax", "argmin") for n in lp.steps
                   if n.kind == "reduction")
    return LoopPlan(steps, tuple(isyms), tuple(dims), tuple(int(e) for e in extents), vector,
                    simd, tiny, unroll, unroll_sym, tuple(tiles.items()),
                    split and _read_later(kern, k, exprs))


def kernel_writes(kern: Kernel, g: LoweredGraph) -> set[str]:
    """Buffers the kernel writes: its nodes, the buffers in-place results overwrite
    (codegen/memory/inplace.py), its scratch buffers."""
    return {n.name for n in kern.nodes} | {g.storage[n.name] for n in kern.nodes
                                           if n.name in g.storage} | set(kern.scratch)


def work(kern: Kernel) -> int:
    """Elements the kernel's loops touch, times the steps of each."""
    return sum(_numel(lp.inner) * len(lp.steps) for lp in kern.loops) * _numel(kern.outer)


def _vector_dim(osyms, outer, lanes, shape, tiny: int) -> tuple:
    """(symbol, extent) of the index a loop vectorizes along; (None, 0) if none."""
    if lanes:
        return osyms[-1], int(outer[-1])
    isyms, _, extents = shape
    if tiny:
        return isyms[-2], int(extents[-2])
    return (isyms[-1], int(extents[-1])) if isyms else (None, 0)


def _tiny_inner(kern: Kernel, lp: Loop, shape, lanes_or_reuse: bool, target: CppTarget) -> int:
    """The extent of the loop's innermost dim when it is too short for a vector (an NCHW image
    of 3 channels read into NHWC): the printer unrolls it inside a vector loop over the next
    dim, whose loads (or stores) are the contiguous ones; 0 to keep the loop as it is."""
    isyms, _, extents = shape
    if lanes_or_reuse or kern.scratch or len(isyms) < 2:
        return 0
    if any(n.kind != "pointwise" for n in lp.steps):
        return 0
    inner, nxt = int(extents[-1]), int(extents[-2])
    return inner if inner <= target.tiny_inner and nxt >= 2 * target.tiny_inner else 0


def _thread_split(kern: Kernel, lanes: Optional[int], reuse: bool, target: CppTarget) -> bool:
    """Split reduced dims over threads (codegen/cpp/threads.py): a lanes kernel with one lane
    block, enough work, and only reductions that fold."""
    if not lanes or kern.scratch or reuse:
        return False
    if _numel(kern.outer) // lanes != 1 or work(kern) < target.parallel_work:
        return False
    return all(n.kind == "pointwise" or n.reduce_op in FOLDABLE
               for lp in kern.loops for n in lp.steps)


def _unroll(lp: Loop, lanes: Optional[int], isyms, extents, target: CppTarget) -> int:
    """Accumulator sets for a lanes reduction loop: one set of fewer than `unroll_lanes` lanes
    is a chain of dependent vector adds, latency-bound (NHWC batch-norm statistics of 16
    channels read at half the bandwidth); each set takes every unroll-th trip of the innermost
    reduced dim, and the sets are combined in order afterwards."""
    if not lanes or not isyms or lanes >= target.unroll_lanes:
        return 1
    if any(n.kind != "reduction" or n.reduce_op not in FOLDABLE for n in lp.steps):
        return 1
    k = target.unroll_lanes // lanes
    return k if int(extents[-1]) % k == 0 and int(extents[-1]) >= k else 1


def _read_later(kern: Kernel, k: int, exprs) -> bool:
    """Does a later loop load a pointwise result loop k stored? (Reduction results reach later
    loops as values, not through memory.)"""
    stored = {n.name for n in kern.loops[k].steps if n.kind == "pointwise"}
    return any(x.buf in stored for q in kern.loops[k + 1:] for n in q.steps
               for x in ir.loads(exprs[n.name]))


def brief(e: ir.Expr, limit: int = 100) -> str:
    """A one-line spelling of a value expression for plan summaries (cut at `limit`)."""
    text = _brief(e)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _brief(e: ir.Expr) -> str:
    if isinstance(e, ir.Load):
        return f"{e.buf}[{e.index}]"
    if isinstance(e, ir.Const):
        return repr(e.value)
    if isinstance(e, ir.IndexValue):
        return f"index({e.expr})"
    return f"{e.name}({', '.join(_brief(a) for a in e.args)})"


def _numel(shape) -> int:
    n = 1
    for s in shape or ():
        n *= int(s)
    return n
