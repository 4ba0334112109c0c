"""Kernel -> KernelPlan: every choice the Triton printer makes about a kernel, made before any
code is printed, as data that prints itself. The printer (codegen/triton/printer.py) only spells
a plan.

A plan says how the kernel is tiled (mode: one 1-D program per XBLOCK elements, a transposing
[XBLOCK / 32, 32] tile (transpose.py), [XBLOCK, R] rows reduced persistent / looped / column,
a two-stage split over many programs (split.py), or a scatter's init + atomic passes), whether
index math needs int64, which loops wait for rows an earlier loop stored, and the launch
configs it may run with (configs.py: the heuristic first, then the autotune candidates).
`TritonTarget` holds the thresholds these choices are made against.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Union

import torch

from trainc.codegen import ir
from trainc.codegen.graph import LoweredGraph
from trainc.codegen.scheduler import Kernel, Loop, reads
from trainc.codegen.split_reductions import grain
from trainc.codegen.symbols import Symbols
from trainc.codegen.triton.configs import LaunchConfig, candidates, next_pow2
from trainc.codegen.triton.split import (CHUNK_TARGET, MAX_CHUNKS, SPLIT_LIMIT, chunks,
                                         splittable)
from trainc.codegen.triton.transpose import MIN_ELEMENTS, transposed_dims

PERSISTENT_LIMIT = 4096  # a row of at most this many elements is reduced in one tile
INT32_LIMIT = 2**31 - 1
LATENCY_BOUND = 4096  # a loop of at most this many elements: its stores go last
LOW = (torch.bfloat16, torch.float16)
ROWS = ("persistent", "looped", "column")  # the modes of kernels reducing [XBLOCK, R] rows


@dataclass(frozen=True)
class TritonTarget:
    """What the Triton backend plans for: the longest row one persistent tile reduces, when a
    reduction to scalars splits over many programs (and how many), from how many elements a
    transposing pointwise kernel is tiled, and whether float32 division is IEEE-rounded
    (Config.triton_precise_div; a division feeding a floor or comparison always is)."""
    persistent_limit: int = PERSISTENT_LIMIT
    split_limit: int = SPLIT_LIMIT
    chunk_target: int = CHUNK_TARGET
    max_chunks: int = MAX_CHUNKS
    transpose_min: int = MIN_ELEMENTS
    precise_div: bool = False
    # capabilities (codegen/target.py Target)
    vector_lanes: tuple[int, ...] = ()  # blocks of a program, not SIMD lanes
    tiles: bool = True  # transposing pointwise kernels as 2-D tiles (triton/transpose.py)
    # channels-last where cuDNN would run NHWC anyway (Config.conv_channels_last)
    channels_last: Union[bool, str] = "eager_tf32"
    accumulates_grads: bool = False
    cuda_graphs: bool = True
    partition_objective: str = "bytes"  # recompute is cheap on GPUs
    compile_workers: bool = True
    offloads: bool = True

    def __str__(self) -> str:
        div = "IEEE float32 division" if self.precise_div else "float32 division by `/`"
        return (f"triton target: persistent rows <= {self.persistent_limit}, split scalar "
                f"reductions over > {self.split_limit} elements (>= {self.chunk_target} a "
                f"program, <= {self.max_chunks} programs), transposing tiles from "
                f"{self.transpose_min} elements, {div}")


GPU = TritonTarget()


@dataclass(frozen=True)
class LoopPlan:
    """One loop of a kernel's program: its nodes, the row it runs over, how it is cut."""
    steps: tuple[str, ...]  # its nodes, reductions as "name=op"
    rnumel: int  # elements of one row (a pointwise kernel's loop: 0)
    width: int = 0  # persistent: the row's tile width (a power of two); else 0 (RBLOCK)
    barrier: bool = False  # reads rows an earlier loop of this program stored
    chunks: int = 0  # split: programs of its first stage
    # its stores printed after all its loads: a loop of few elements has no other programs to
    # hide a load's latency, and a load printed after a store waits for it (BatchNorm's 72
    # num_batches_tracked += 1 in one program took 153 µs on the H100)
    stores_last: bool = False

    def __str__(self) -> str:
        head = f"loop {self.rnumel}: " if self.rnumel else "loop: "
        head += ", ".join(self.steps)
        notes = [f"tile {self.width}"] if self.width else []
        if self.chunks:
            notes.append(f"{self.chunks} chunks")
        if self.barrier:
            notes.append("barrier before")
        if self.stores_last:
            notes.append("stores last")
        return head + ("; " + "; ".join(notes) if notes else "")


@dataclass(frozen=True)
class KernelPlan:
    """What the printer does to one kernel; `str()` is the summary TRAINC_DEBUG_DIR's
    42_kernels.txt lists."""
    name: str
    # "1d" | "tile" (a transposing 1-D kernel) | "persistent" | "looped" | "column" |
    # "split" | "scatter"
    mode: str
    xnumel: int  # 1d/tile/scatter init: elements; rows: outer rows; split: 1
    rnumel: int  # rows: the longest row; split: the longest loop; scatter: scattered values
    rblock: int = 0  # persistent: the widest row tile
    index64: bool = False  # int64 index math (some extent passes int32)
    tile: Optional[tuple[int, int]] = None  # tile: (store dim, load dim), transpose.py
    accumulate32: bool = False  # scatter: a 16-bit add accumulates in a float32 scratch
    loops: tuple[LoopPlan, ...] = ()
    configs: tuple[LaunchConfig, ...] = ()  # the heuristic, then the autotune candidates
    precise_div: bool = False
    # the index symbols planning made, which the printer goes on with (1d/tile: every dim's;
    # rows: the outer dims'); their creation order fixes the printed source
    syms: tuple = field(default=(), repr=False, compare=False)
    scope: Optional[Symbols] = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str:
        """The launch kind: "1d", "2d" ([XBLOCK, R] rows), "split" or "scatter"."""
        return "1d" if self.mode == "tile" else "2d" if self.mode in ROWS else self.mode

    def __str__(self) -> str:
        if self.mode in ROWS:
            head = f"{self.name}: {self.mode}, {self.xnumel} rows of <= {self.rnumel}"
        elif self.mode == "scatter":
            head = f"{self.name}: scatter, {self.rnumel} values into {self.xnumel}"
        elif self.mode == "split":
            head = f"{self.name}: split, loops of <= {self.rnumel}"
        else:
            head = f"{self.name}: {self.mode}, {self.xnumel} elements"
        if self.tile is not None:
            head += f", stores along dim {self.tile[0]}, loads along dim {self.tile[1]}"
        if self.accumulate32:
            head += ", float32 accumulator"
        if self.index64:
            head += ", int64 indices"
        lines = [head] + [f"  {lp}" for lp in self.loops]
        if self.configs:
            lines.append(f"  configs {self.configs[0]} (heuristic)"
                         + "".join(f", {c}" for c in self.configs[1:]))
        return "\n".join(lines)


def plan_kernel(kern: Kernel, g: LoweredGraph, target: TritonTarget = GPU) -> KernelPlan:
    """The plan of kernel `kern` of graph `g` (makes the kernel's symbol scope in g's table)."""
    scope = g.symbols.kernel(kern.name)  # this kernel's own: its source is its own
    index64 = needs_int64(kern, g)
    common = dict(index64=index64, precise_div=target.precise_div, scope=scope)
    if kern.kind == "scatter":
        n = kern.nodes[0]
        acc = n.reduce_op == "add" and g.buffers[n.name].dtype in LOW
        return _with_configs(KernelPlan(kern.name, "scatter", _numel(n.shape), _numel(n.rshape),
                                        accumulate32=acc, **common))
    if splittable(kern, target.split_limit):
        loops = tuple(LoopPlan(_steps(lp), _numel(lp.inner),
                               chunks=chunks(_numel(lp.inner), target.chunk_target,
                                             target.max_chunks)) for lp in kern.loops)
        return _with_configs(KernelPlan(kern.name, "split", 1,
                                        max(_numel(lp.inner) for lp in kern.loops),
                                        loops=loops, **common))
    if len(kern.loops) == 1 and all(n.kind == "pointwise" for n in kern.loops[0].steps):
        return _plan_pointwise(kern, g, target, common)
    return _plan_rows(kern, g, scope, target, common)


def _plan_pointwise(kern: Kernel, g: LoweredGraph, target: TritonTarget, common) -> KernelPlan:
    lp = kern.loops[0]
    scope = common["scope"]
    shape = tuple(kern.outer) + tuple(lp.inner)
    syms = scope.ranges("o", kern.outer) + scope.ranges("i", lp.inner)
    tile = _transposed(kern, g, lp, syms, shape, target)
    last = _stores_last(kern, lp, _numel(shape))
    return _with_configs(KernelPlan(kern.name, "1d" if tile is None else "tile", _numel(shape),
                                    0, tile=tile, loops=(LoopPlan(_steps(lp), 0,
                                                                  stores_last=last),),
                                    syms=tuple(syms), **common))


def _plan_rows(kern: Kernel, g: LoweredGraph, scope: Symbols, target: TritonTarget,
               common) -> KernelPlan:
    osyms = scope.ranges("o", kern.outer)
    rmax = max((_numel(lp.inner) for lp in kern.loops), default=1)
    # Only rows that would be persistent tiles: long column sums (mlp's and gpt's bias
    # gradients) were 8% (mlp bf16) slower on the H200 with wide x tiles than looped rows.
    fits = next_pow2(rmax) <= target.persistent_limit
    column = fits and not kern.scratch and _column(kern, g, scope)
    mode = "column" if column else "persistent" if fits else "looped"
    written: set[str] = set()
    loops = []
    for k, lp in enumerate(kern.loops):
        barrier = bool(k) and any(x.buf in written for n in lp.steps for x in reads(n, g))
        width = next_pow2(max(_numel(lp.inner), 1)) if mode == "persistent" else 0
        last = _stores_last(kern, lp, _numel(kern.outer) * _numel(lp.inner))
        loops.append(LoopPlan(_steps(lp), _numel(lp.inner), width, barrier, stores_last=last))
        written |= {n.name for n in lp.steps if n.name not in kern.local}
    return _with_configs(KernelPlan(kern.name, mode, _numel(kern.outer), rmax,
                                    next_pow2(rmax) if mode == "persistent" else 0,
                                    loops=tuple(loops), syms=tuple(osyms), **common))


def _with_configs(plan: KernelPlan) -> KernelPlan:
    return dataclasses.replace(plan, configs=candidates(
        plan.kind, plan.xnumel, plan.rnumel, plan.rblock, plan.mode == "column"))


def _stores_last(kern: Kernel, lp: Loop, elements: int) -> bool:
    """Whether loop `lp` (`elements` in all) prints its stores after its loads: only a loop
    small enough to be latency-bound, that stores more than one pointwise value."""
    stored = [n for n in lp.steps if n.kind == "pointwise" and n.name not in kern.local]
    return elements <= LATENCY_BOUND and len(stored) > 1


def _steps(lp: Loop) -> tuple[str, ...]:
    return tuple(n.name if n.kind == "pointwise" else f"{n.name}={n.reduce_op}"
                 for n in lp.steps)


def _column(kern: Kernel, g: LoweredGraph, syms: Symbols) -> bool:
    """More of the reductions' loaded bytes are contiguous along the last outer dim than along
    the last reduced dim (split_reductions.grain)."""
    if not kern.outer:
        return False
    osyms = syms.ranges("o", kern.outer)
    col = row = 0
    for lp in kern.loops:
        isyms = syms.ranges("i", lp.inner)
        if not isyms:
            continue
        for n in lp.steps:
            if n.kind == "reduction":
                c, r = grain(ir.loads(n.fn(osyms, isyms)), osyms[-1], isyms[-1], g)
                col, row = col + c, row + r
    return col > row


def _transposed(kern: Kernel, g: LoweredGraph, lp: Loop, syms, shape,
                target: TritonTarget) -> Optional[tuple[int, int]]:
    """transpose.py's (store dim, load dim) for this pointwise loop, if it transposes."""
    stored = [n for n in lp.steps if n.name not in kern.local]
    stores = [ir.linear(syms, kern.layout(n.name, g).stride) for n in stored]
    parts = [x for n in lp.steps for x in ir.walk(n.fn(syms))]
    if any(isinstance(x, ir.Op) and x.name.startswith("philox") for x in parts):
        return None
    # only loads as large as the loop: a broadcast row vector read along the other dim is
    # no reason to tile
    loads = [x.index for x in parts if isinstance(x, ir.Load) and x.buf not in kern.local
             and 2 * _numel(g.buffers[x.buf].shape) >= _numel(shape)]
    return transposed_dims(syms, shape, stores, loads, target.transpose_min)


def needs_int64(kern: Kernel, g: LoweredGraph) -> bool:
    """int64 index math only when some buffer's extent or the iteration space passes int32."""
    bufs = {x.buf for n in kern.nodes for x in reads(n, g)} | {n.name for n in kern.nodes}
    for b in bufs:
        buf = g.buffers[b]
        extent = 1 + sum((s - 1) * abs(st) for s, st in zip(buf.shape, buf.stride) if s > 0)
        if extent > INT32_LIMIT:
            return True
    for n in kern.nodes:
        if _numel(n.shape) * max(_numel(n.rshape), 1) > INT32_LIMIT:
            return True
    return False


def _numel(shape) -> int:
    n = 1
    for s in shape or ():
        n *= int(s)
    return n
