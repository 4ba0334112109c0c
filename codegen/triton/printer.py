"""Kernel + KernelPlan -> Triton source: 1-D programs for pointwise kernels (transposing ones in
2-D tiles), [XBLOCK, R] tiles for kernels with reductions (persistent when every row fits one
tile, else looped over R), two-stage splits, and an init + atomic pass for scatters.

The printer decides nothing: every choice is in the kernel's plan (codegen/triton/plan.py);
values are spelled by exprs.py, reductions by reductions.py, splits by split.py, scatters by
scatter.py. Sizes are baked in; int64 index math only where the plan says.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from trainc.codegen import ir
from trainc.codegen.graph import LoweredGraph
from trainc.codegen.scheduler import Kernel, Loop
from trainc.codegen.triton import reductions as R
from trainc.codegen.triton.configs import LaunchConfig
from trainc.codegen.triton.exprs import TL, Body, cast_code, compute, literal, tl_compute, \
    to_dtype, widen
from trainc.codegen.triton.plan import (PERSISTENT_LIMIT, KernelPlan, TritonTarget,  # noqa: F401
                                        plan_kernel)
from trainc.codegen.triton.scatter import scatter_source
from trainc.codegen.triton.split import split_source
from trainc.codegen.triton.transpose import TILE_X, tile_lines


@dataclass(frozen=True)
class KernelSource:
    name: str
    # the @triton.jit functions, as (name suffix, what follows "def <name><suffix>"); scatters:
    # "_init", ""[, "_cast"]; split: one per stage. Without the name: equal kernels are equal.
    funcs: tuple[tuple[str, str], ...]
    params: tuple[str, ...]
    mode: str  # the plan's launch kind: "1d" | "2d" | "split" | "scatter"
    xnumel: int  # 1d/scatter-init: elements; 2d: outer rows
    rnumel: int  # 2d: largest row; scatter: scattered values
    rblock: int  # 2d persistent: the tile width; 0 when looped
    inplace: tuple[str, ...] = ()  # params the kernel both reads and writes (re-runs differ)
    stages: tuple = ()  # split: (split.Stage, ...) launched in order
    scratch: tuple = ()  # split, scatter: (split.Scratch, ...) per call, passed after params
    column: bool = False  # 2d: the plan's "column" mode (wide x tiles, looped over r)
    configs: tuple[LaunchConfig, ...] = ()  # the plan's: the heuristic, then the candidates

    @property
    def source(self) -> str:
        return "\n\n\n".join(f"@triton.jit\ndef {self.name}{suffix}{rest}"
                               for suffix, rest in self.funcs)


class KernelPrinter:
    """Spells one kernel from its plan; the state here is only what printing tracks."""

    def __init__(self, kern: Kernel, plan: KernelPlan, g: LoweredGraph):
        if plan.name != kern.name:
            raise ValueError(f"trainc triton: plan of {plan.name} given for kernel {kern.name}")
        if plan.mode != "scatter" and len(plan.loops) != len(kern.loops):
            raise ValueError(f"trainc triton: plan of {kern.name} has {len(plan.loops)} loops, "
                             f"the kernel {len(kern.loops)}")
        self.k, self.g, self.plan = kern, g, plan
        self.syms = plan.scope
        self.precise_div = plan.precise_div
        self.exact_divs: set = set()  # divisions printed IEEE-rounded whatever precise_div
        self.params: dict[str, bool] = {}
        self.loaded: set[str] = set()
        # an in-place result is stored into the buffer it overwrites (codegen/memory/inplace.py)
        self.rename = {n.name: g.storage[n.name] for n in kern.nodes if n.name in g.storage}
        self.rename_loads: dict[str, str] = {}  # split: reduction results read from scratch
        self.scratch_dtype: dict[str, torch.dtype] = {}
        self.values: dict[str, str] = {}  # buffer -> variable holding its value in this tile
        self.axes: dict[str, frozenset] = {}
        self.sym_axes: dict = {}
        self.consts: dict = {}
        self.const_lines: list[str] = []
        self._tmp = 0
        self.mode = plan.kind
        self.rmask, self.rz = "rmask", "rz"
        self.deferred: "list | None" = None  # stores held back to the end of a loop

    def tmp(self) -> str:
        self._tmp += 1
        return f"t{self._tmp}"

    def param(self, buf: str, written: bool = False) -> str:
        """Buffer `buf` as a parameter, named by its position: launches pass buffers by
        position, so the layers of a model print one kernel and share its compile."""
        self.params[buf] = self.params.get(buf, False) or written
        return f"in_{list(self.params).index(buf)}"

    def param_names(self) -> list[str]:
        return [f"in_{k}" for k in range(len(self.params))]

    def const(self, e: ir.Const) -> str:
        key = (repr(e.value), e.dtype)
        if key not in self.consts:
            name = f"c{len(self.consts)}"
            shape = "[1]" if self.mode not in ("2d", "split") else "[1, 1]"
            self.const_lines.append(
                f"    {name} = tl.full({shape}, {literal(e.value, e.dtype)}, "
                f"{tl_compute(e.dtype)})")
            self.consts[key] = name
        return self.consts[key]

    def mask(self, axes: frozenset):
        if not axes:
            return None
        if self.mode not in ("2d", "split"):
            return "xmask"
        if axes == {"x"}:
            return "xmask"
        return self.rmask if axes == {"r"} else f"xmask & {self.rmask}"

    def keep(self, body: Body, buf: str, v: str) -> None:
        """Later steps of this kernel read reduction result `buf` as v, rounded as the stored
        buffer is: a bf16 value must compare equal to itself reloaded (amax backward's
        x == max). Pointwise values come rounded from the lowering (graph._rounded)."""
        dt = self.g.buffers[buf].dtype
        if dt in (torch.bfloat16, torch.float16):
            r = self.tmp()
            body.emit(f"{r} = {cast_code(v, dt, dt)}")
            self.axes[r] = self.axes.get(v, frozenset())
            v = r
        self.values[buf] = v

    def load(self, body: Body, e: ir.Load) -> str:
        if e.buf in self.values:
            return self.values[e.buf]
        b = self.g.buffers[e.buf]
        if _numel(b.shape) == 0:  # only read in empty loops; a load (masked or not, the index
            return f"xz.to({TL[compute(b.dtype)]})"  # may be constant) would be out of bounds
        idx = body.index(e.index)
        m = self.mask(body.axes_of(e.index))
        if e.buf in self.rename_loads:  # kept in compute precision: no conversion
            return f"tl.load({self.rename_loads[e.buf]} + {idx})"
        buf = self.rename.get(e.buf, e.buf)
        param = self.param(buf)
        self.loaded.add(buf)
        code = f"tl.load({param} + {idx}" + (f", mask={m}, other=0)" if m else ")")
        dtype = self.g.buffers[e.buf].dtype
        return widen(code, dtype) if dtype in (torch.bfloat16, torch.float16) else code

    def store(self, body: Body, buf: str, idx: str, v: str, zeros: str, mask: str,
              atomic: bool = False) -> None:
        dt = self.g.buffers[buf].dtype
        param = self.param(self.rename.get(buf, buf), written=True)
        f = "tl.atomic_add" if atomic else "tl.store"
        line = f"{f}({param} + {idx} + {zeros}, {to_dtype(v, dt, dt)}, mask={mask})"
        if self.deferred is not None:
            self.deferred.append((body, line))
        else:
            body.emit(line)

    def defer_stores(self, on: bool) -> None:
        """From here, hold stores back (plan's stores_last) until flush_stores."""
        self.deferred = [] if on else None

    def flush_stores(self) -> None:
        for body, line in self.deferred or ():
            body.emit(line)
        self.deferred = None

    # -- kernels ----------------------------------------------------------------------------
    def source(self) -> KernelSource:
        plan = self.plan
        launch = dict(mode=plan.kind, xnumel=plan.xnumel, rnumel=plan.rnumel,
                      rblock=plan.rblock, column=plan.mode == "column", configs=plan.configs)
        if plan.kind == "scatter":
            funcs, scratch = scatter_source(self)
            ks = KernelSource(self.k.name, tuple(funcs), tuple(self.params), scratch=scratch,
                              **launch)
        elif plan.kind == "1d":
            ks = KernelSource(self.k.name, (self._pointwise(),), tuple(self.params), **launch)
        elif plan.kind == "split":
            funcs, stages, scratch = split_source(self)
            ks = KernelSource(self.k.name, tuple(funcs), tuple(self.params), stages=tuple(stages),
                              scratch=tuple(scratch), **launch)
        else:
            ks = KernelSource(self.k.name, (self._tiled(),), tuple(self.params), **launch)
        both = tuple(p for p, w in self.params.items() if w and p in self.loaded)
        return dataclasses.replace(ks, inplace=both)

    def _func(self, suffix: str, body: Body, n: int, extra: str = "",
              scratch: tuple = ()) -> tuple[str, str]:
        """(suffix, the function after its name) of a function over `n` elements."""
        params = "".join(f"{p}, " for p in [*self.param_names(), *(s.name for s in scratch)])
        pid = self._pid()
        shape2 = self.mode == "2d" and suffix == ""
        ar = "tl.arange(0, XBLOCK)[:, None]" if shape2 else "tl.arange(0, XBLOCK)"
        zs = "[XBLOCK, 1]" if shape2 else "[XBLOCK]"
        head = [f"({params}XBLOCK: tl.constexpr{extra}):", f"    xindex = {pid} * XBLOCK + {ar}",
                f"    xmask = xindex < {n}", f"    xz = tl.zeros({zs}, tl.int32)"]
        if self.plan.tile is not None:  # transpose.py: every tile is whole
            head[1:] = [f"    xz = tl.zeros([XBLOCK // {TILE_X}, {TILE_X}], tl.int32)",
                        "    xmask = xz == 0"]
        return suffix, "\n".join(head + self.const_lines + body.lines)

    def _split(self, body: Body, var: str, syms, shape, axis: str) -> None:
        """Unflatten `var` into one symbol per dim (row-major)."""
        strides = ir.contiguous_strides(shape)
        for d, (s, st, size) in enumerate(zip(syms, strides, shape)):
            self.sym_axes[s] = frozenset({axis})
            q = var if st == 1 else f"({var} // {st})"
            body.emit(f"{s.name} = {q}" if d == 0 else f"{s.name} = {q} % {size}")

    def _pointwise(self) -> tuple[str, str]:
        lp = self.k.loops[0]
        shape = tuple(self.k.outer) + tuple(lp.inner)
        syms = list(self.plan.syms)  # made by the plan: every dim's
        body = Body(self, "    ")
        if self.plan.tile is None:
            self._split(body, "xindex", syms, shape, "x")
        else:
            for s in syms:
                self.sym_axes[s] = frozenset({"x"})
            for line in tile_lines(syms, shape, *self.plan.tile, self._pid()):
                body.emit(line)
        self.defer_stores(self.plan.loops[0].stores_last)
        for n in lp.steps:
            v = body.value(n.fn(syms))
            if n.name not in self.k.local:
                b = self.k.layout(n.name, self.g)
                self.store(body, n.name, body.index(ir.linear(syms, b.stride)), v, "xz", "xmask")
            self.values[n.name] = v
        self.flush_stores()
        return self._func("", body, _numel(shape))

    def _pid(self) -> str:
        return "tl.program_id(0).to(tl.int64)" if self.plan.index64 else "tl.program_id(0)"

    def _tiled(self) -> tuple[str, str]:
        osyms = list(self.plan.syms)  # made by the plan: the outer dims'
        body = Body(self, "    ")
        self._split(body, "xindex", osyms, self.k.outer, "x")
        persistent = self.plan.mode == "persistent"
        shared: dict = {}  # persistent: inner shape -> (isyms, rindex, rmask, rz)
        for k, (lp, lplan) in enumerate(zip(self.k.loops, self.plan.loops)):
            if lplan.barrier:
                body.emit("tl.debug_barrier()")  # rows written by an earlier loop of this tile
            self._loop(body, lp, osyms, persistent, shared, k)
        extra = "" if persistent else ", RBLOCK: tl.constexpr"
        return self._func("", body, _numel(self.k.outer), extra)

    def _loop(self, outer: Body, lp: Loop, osyms, persistent: bool, shared: dict,
              k: int) -> None:
        rnumel = _numel(lp.inner)
        if persistent:
            width = f"{self.plan.loops[k].width}"
            if lp.inner not in shared:
                isyms = self.syms.ranges("i", lp.inner)
                j = len(shared)
                shared[lp.inner] = (isyms, f"rindex{j}", f"rmask{j}", f"rz{j}")
                self._rvars(outer, f"tl.arange(0, {width})[None, :]", rnumel, shared[lp.inner],
                            f"[1, {width}]")
            isyms, rindex, self.rmask, self.rz = shared[lp.inner]
            inner = outer
        else:
            isyms, rindex = self.syms.ranges("i", lp.inner), f"rindex{k}"
            self.rmask, self.rz = f"rmask{k}", f"rz{k}"
            width = "RBLOCK"
        reds = [n for n in lp.steps if n.kind == "reduction"]
        accs = {n.name: R.acc_init(self, outer, n, width) for n in reds}
        if not persistent:
            outer.emit(f"for r{k} in range(0, {rnumel}, RBLOCK):")
            inner = outer.child()
            self._rvars(inner, f"r{k} + tl.arange(0, RBLOCK)[None, :]", rnumel,
                        (isyms, rindex, self.rmask, self.rz), "[1, RBLOCK]")
        saved = dict(self.values)
        self.defer_stores(self.plan.loops[k].stores_last)
        for n in lp.steps:
            if n.kind == "pointwise":
                v = inner.value(n.fn(osyms + isyms))
                if n.name not in self.k.local:
                    b = self.k.layout(n.name, self.g)
                    idx = inner.index(ir.linear(osyms + isyms, b.stride))
                    self.store(inner, n.name, idx, v, f"xz + {self.rz}", f"xmask & {self.rmask}")
                self.values[n.name] = v
            else:
                R.accumulate(self, inner, n, accs[n.name], n.fn(osyms, isyms), rindex)
        self.flush_stores()
        # values the scheduler keeps in registers (scratch: a later loop reads them at the
        # position they were computed at) stay visible to the next loops of a persistent tile
        kept = {n.name: self.values[n.name] for n in lp.steps if n.name in self.k.scratch}
        if kept and not persistent:
            raise ValueError(f"trainc triton: {self.k.name} keeps values in registers "
                             f"({', '.join(kept)}): its plan must be persistent, not "
                             f"{self.plan.mode}")
        self.values = {**saved, **kept}
        for n in reds:
            R.finish(self, outer, n, accs[n.name], osyms)

    def _rvars(self, body: Body, arange: str, rnumel: int, names, zshape: str) -> None:
        isyms, rindex, rmask, rz = names
        cast = ".to(tl.int64)" if self.plan.index64 else ""
        body.emit(f"{rindex} = ({arange}){cast}")
        body.emit(f"{rmask} = {rindex} < {rnumel}")
        body.emit(f"{rz} = tl.zeros({zshape}, tl.int32)")
        self._split(body, rindex, isyms, tuple(s.extent for s in isyms), "r")


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def print_kernel(kern: Kernel, plan: KernelPlan, g: LoweredGraph) -> KernelSource:
    """The Triton functions of kernel `kern` as its plan says, and its launch data."""
    return KernelPrinter(kern, plan, g).source()


def kernel_source(kern: Kernel, g: LoweredGraph, precise_div: bool = True) -> KernelSource:
    """The kernel's source, planned here (a TritonTarget with this precise_div)."""
    return print_kernel(kern, plan_kernel(kern, g, TritonTarget(precise_div=precise_div)), g)
