"""Scheduled kernels -> Triton source: 1D tiles for pointwise kernels, [XBLOCK, R] tiles for
kernels with reductions (persistent when every row fits one tile, else looped over R), and an
init + atomic pass for scatters. Sizes are baked in; int64 index math only when they need it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import sympy
import torch

from trainc.codegen import ir
from trainc.codegen.graph import ComputeNode, LoweredGraph
from trainc.codegen.scheduler import Kernel, Loop, reads
from trainc.codegen.symbols import Symbols
from trainc.codegen.triton.exprs import (TL, Body, _interpreting, cast_code, compute,
                                          index_code, literal, tl_compute, to_dtype, widen)
from trainc.codegen.triton.split import Scratch, split_source, splittable
from trainc.codegen.triton.transpose import TILE_X, tile_lines, transposed_dims

PERSISTENT_LIMIT = 4096  # a row of at most this many elements is reduced in one tile
INT32_LIMIT = 2**31 - 1
BIG_INDEX = 2**62  # argmax lanes that have not seen a value yet


@dataclass(frozen=True)
class KernelSource:
    name: str
    # the @triton.jit functions, as (name suffix, what follows "def <name><suffix>"); scatters:
    # "_init", ""[, "_cast"]; split: one per stage. Without the name: equal kernels are equal.
    funcs: tuple[tuple[str, str], ...]
    params: tuple[str, ...]
    mode: str  # "1d" | "2d" | "scatter"
    xnumel: int  # 1d/scatter-init: elements; 2d: outer rows
    rnumel: int  # 2d: largest row; scatter: scattered values
    rblock: int  # 2d persistent: the tile width; 0 when looped
    inplace: tuple[str, ...] = ()  # params the kernel both reads and writes (re-runs differ)
    stages: tuple = ()  # split: (split.Stage, ...) launched in order
    scratch: tuple = ()  # split, scatter: (split.Scratch, ...) per call, passed after params
    # 2d: rows short enough for a persistent tile whose reductions read memory contiguous
    # along x, across the reduced dims (per-channel statistics of channels-last data): wide x
    # tiles, looped over r instead
    column: bool = False

    @property
    def source(self) -> str:
        return "\n\n\n".join(f"@triton.jit\ndef {self.name}{suffix}{rest}"
                               for suffix, rest in self.funcs)


LOW = (torch.bfloat16, torch.float16)


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _column(kern: Kernel, syms: Symbols) -> bool:
    """More of the reductions' loads are contiguous along the last outer dim than along the
    last reduced dim."""
    if not kern.outer:
        return False
    osyms = syms.ranges("o", kern.outer)
    row = col = 0
    for lp in kern.loops:
        isyms = syms.ranges("i", lp.inner)
        if not isyms:
            continue
        for n in lp.steps:
            if n.kind != "reduction":
                continue
            for load in ir.loads(n.fn(osyms, isyms)):
                index = sympy.sympify(load.index)
                if index.diff(isyms[-1]) == 1:
                    row += 1
                elif index.diff(osyms[-1]) == 1:
                    col += 1
    return col > row


class KernelPrinter:
    def __init__(self, kern: Kernel, g: LoweredGraph, precise_div: bool = True):
        self.k, self.g = kern, g
        self.syms = g.symbols.kernel(kern.name)  # this kernel's own: its source is its own
        self.precise_div = precise_div
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
        self.need64 = _needs_int64(kern, g)
        self.mode = _mode(kern)
        self.tile: Optional[tuple[int, int]] = None  # pointwise: transpose.py's tile dims
        self.rmask, self.rz = "rmask", "rz"

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
        body.emit(f"{f}({param} + {idx} + {zeros}, {to_dtype(v, dt, dt)}, mask={mask})")

    # -- kernels ----------------------------------------------------------------------------
    def source(self) -> KernelSource:
        if self.mode == "scatter":
            ks = self._scatter()
        elif self.mode == "1d":
            ks = self._pointwise()
        elif self.mode == "split":
            funcs, stages, scratch = split_source(self)
            ks = KernelSource(self.k.name, tuple(funcs), tuple(self.params), "split",
                              1, max(_numel(lp.inner) for lp in self.k.loops), 0, (),
                              tuple(stages), tuple(scratch))
        else:
            ks = self._tiled()
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
        if self.tile is not None:  # transpose.py: every tile is whole
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

    def _pointwise(self) -> KernelSource:
        lp = self.k.loops[0]
        shape = tuple(self.k.outer) + tuple(lp.inner)
        syms = self.syms.ranges("o", self.k.outer) + self.syms.ranges("i", lp.inner)
        body = Body(self, "    ")
        self.tile = self._transposed(lp, syms, shape)
        if self.tile is None:
            self._split(body, "xindex", syms, shape, "x")
        else:
            for s in syms:
                self.sym_axes[s] = frozenset({"x"})
            for line in tile_lines(syms, shape, *self.tile, self._pid()):
                body.emit(line)
        for n in lp.steps:
            v = body.value(n.fn(syms))
            if n.name not in self.k.local:
                b = self.k.layout(n.name, self.g)
                self.store(body, n.name, body.index(ir.linear(syms, b.stride)), v, "xz", "xmask")
            self.values[n.name] = v
        total = _numel(shape)
        return KernelSource(self.k.name, (self._func("", body, total),), tuple(self.params), "1d",
                            total, 0, 0)

    def _transposed(self, lp: Loop, syms, shape) -> Optional[tuple[int, int]]:
        """transpose.py's (store dim, load dim) for this pointwise loop, if it transposes."""
        stored = [n for n in lp.steps if n.name not in self.k.local]
        stores = [ir.linear(syms, self.k.layout(n.name, self.g).stride) for n in stored]
        parts = [x for n in lp.steps for x in ir.walk(n.fn(syms))]
        if any(isinstance(x, ir.Op) and x.name.startswith("philox") for x in parts):
            return None
        # only loads as large as the loop: a broadcast row vector read along the other dim is
        # no reason to tile
        loads = [x.index for x in parts if isinstance(x, ir.Load) and x.buf not in self.k.local
                 and 2 * _numel(self.g.buffers[x.buf].shape) >= _numel(shape)]
        return transposed_dims(syms, shape, stores, loads)

    def _pid(self) -> str:
        return "tl.program_id(0).to(tl.int64)" if self.need64 else "tl.program_id(0)"

    def _tiled(self) -> KernelSource:
        osyms = self.syms.ranges("o", self.k.outer)
        body = Body(self, "    ")
        self._split(body, "xindex", osyms, self.k.outer, "x")
        rmax = max((_numel(lp.inner) for lp in self.k.loops), default=1)
        # Only rows that would be persistent tiles: long column sums (mlp's and gpt's bias
        # gradients) were 8% (mlp bf16) slower on the H200 with wide x tiles than looped rows.
        fits = next_pow2(rmax) <= PERSISTENT_LIMIT
        column = fits and not self.k.scratch and _column(self.k, self.syms)
        persistent = fits and not column
        shared: dict = {}  # persistent: inner shape -> (isyms, rindex, rmask, rz)
        written: set[str] = set()
        for k, lp in enumerate(self.k.loops):
            if k and any(l.buf in written for n in lp.steps for l in reads(n, self.g)):
                body.emit("tl.debug_barrier()")  # rows written by an earlier loop of this tile
            self._loop(body, lp, osyms, persistent, shared, k)
            written |= {n.name for n in lp.steps if n.name not in self.k.local}
        extra = "" if persistent else ", RBLOCK: tl.constexpr"
        func = self._func("", body, _numel(self.k.outer), extra)
        return KernelSource(self.k.name, (func,), tuple(self.params), "2d",
                            _numel(self.k.outer), rmax, next_pow2(rmax) if persistent else 0,
                            column=column)

    def _loop(self, outer: Body, lp: Loop, osyms, persistent: bool, shared: dict,
              k: int) -> None:
        R = _numel(lp.inner)
        if persistent:
            if lp.inner not in shared:
                isyms = self.syms.ranges("i", lp.inner)
                j = len(shared)
                shared[lp.inner] = (isyms, f"rindex{j}", f"rmask{j}", f"rz{j}")
                width = next_pow2(max(R, 1))
                self._rvars(outer, f"tl.arange(0, {width})[None, :]", R, shared[lp.inner],
                            f"[1, {width}]")
            isyms, rindex, self.rmask, self.rz = shared[lp.inner]
            width = f"{next_pow2(max(R, 1))}"
            inner = outer
        else:
            isyms, rindex = self.syms.ranges("i", lp.inner), f"rindex{k}"
            self.rmask, self.rz = f"rmask{k}", f"rz{k}"
            width = "RBLOCK"
        reds = [n for n in lp.steps if n.kind == "reduction"]
        accs = {n.name: self._acc_init(outer, n, width) for n in reds}
        if not persistent:
            outer.emit(f"for r{k} in range(0, {R}, RBLOCK):")
            inner = outer.child()
            self._rvars(inner, f"r{k} + tl.arange(0, RBLOCK)[None, :]", R,
                        (isyms, rindex, self.rmask, self.rz), "[1, RBLOCK]")
        saved = dict(self.values)
        for n in lp.steps:
            if n.kind == "pointwise":
                v = inner.value(n.fn(osyms + isyms))
                if n.name not in self.k.local:
                    b = self.k.layout(n.name, self.g)
                    idx = inner.index(ir.linear(osyms + isyms, b.stride))
                    self.store(inner, n.name, idx, v, f"xz + {self.rz}", f"xmask & {self.rmask}")
                self.values[n.name] = v
            else:
                self._accumulate(inner, n, accs[n.name], n.fn(osyms, isyms), rindex)
        # values the scheduler keeps in registers (scratch: a later loop reads them at the
        # position they were computed at) stay visible to the next loops of a persistent tile
        kept = {n.name: self.values[n.name] for n in lp.steps if n.name in self.k.scratch}
        assert persistent or not kept, "trainc triton: register-kept values need a persistent tile"
        self.values = {**saved, **kept}
        for n in reds:
            self._finish(outer, n, accs[n.name], osyms)

    def _rvars(self, body: Body, arange: str, R: int, names, zshape: str) -> None:
        isyms, rindex, rmask, rz = names
        cast = ".to(tl.int64)" if self.need64 else ""
        body.emit(f"{rindex} = ({arange}){cast}")
        body.emit(f"{rmask} = {rindex} < {R}")
        body.emit(f"{rz} = tl.zeros({zshape}, tl.int32)")
        self._split(body, rindex, isyms, self._inner_shape(isyms), "r")

    @staticmethod
    def _inner_shape(isyms) -> tuple[int, ...]:
        return tuple(s.extent for s in isyms)

    # -- reductions ---------------------------------------------------------------------------
    def _acc_init(self, body: Body, n: ComputeNode, width: str) -> list[str]:
        dt = _acc_dtype(n)
        acc = self.tmp()
        shape = f"[XBLOCK, {width}]"
        op = n.reduce_op
        if op in ("sum", "prod"):
            body.emit(f"{acc} = tl.full({shape}, {0 if op == 'sum' else 1}, {TL[dt]})")
            return [acc]
        init = _extreme(dt, op in ("max", "argmax"))
        body.emit(f"{acc} = tl.full({shape}, {init}, {TL[dt]})")
        if op in ("max", "min"):
            return [acc]
        body.emit(f"{acc}i = tl.full({shape}, {BIG_INDEX}, tl.int64)")
        return [acc, acc + "i"]

    def _accumulate(self, body: Body, n: ComputeNode, acc: list[str], e: ir.Expr,
                    rindex: str) -> None:
        v = body.value(e)
        if e.dtype == torch.bool:
            v = f"{v}.to(tl.int32)"
        if not self.axes.get(v) and v.startswith("t"):  # a scalar: give it the tile's shape
            b = self.tmp()
            body.emit(f"{b} = {v} + tl.zeros_like({acc[0]})")
            v = b
        m = f"xmask & {self.rmask}"
        a = acc[0]
        op = n.reduce_op
        if op == "sum":
            body.emit(f"{a} = {a} + tl.where({m}, {v}, 0)")
        elif op == "prod":
            body.emit(f"{a} = {a} * tl.where({m}, {v}, 1)")
        elif op in ("max", "min"):
            body.emit(f"{a} = tl.where({m}, {_extremum(op, _acc_dtype(n))}({a}, {v}), {a})")
        else:
            cmp = ">" if op == "argmax" else "<"
            take = self.tmp()
            body.emit(f"{take} = {m} & (({v} {cmp} {a}) | (({v} != {v}) & ({a} == {a})) | "
                      f"({acc[1]} == {BIG_INDEX}))")
            body.emit(f"{a} = tl.where({take}, {v}, {a})")
            body.emit(f"{acc[1]} = tl.where({take}, {rindex} + xz, {acc[1]})")

    def combine(self, body: Body, n: ComputeNode, acc: list[str]) -> str:
        """The accumulator tile of reduction n reduced along its row: a [XBLOCK, 1] variable
        (max/min: NaN where any element was NaN)."""
        f = self.tmp()
        op, a = n.reduce_op, acc[0]
        if op == "sum":
            body.emit(f"{f} = tl.sum({a}, 1)[:, None]")
        elif op == "prod":
            body.emit(f"{f} = tl.reduce({a}, 1, _prod)[:, None]")
        elif op in ("max", "min"):
            body.emit(f"{f} = {_reduce_extremum(op, _acc_dtype(n), a)}[:, None]")
        else:
            body.emit(f"_, {f} = tl.reduce(({a}, {acc[1]}), 1, _{op}_combine)")
            body.emit(f"{f} = {f}[:, None]")
        return f

    def _finish(self, body: Body, n: ComputeNode, acc: list[str], osyms) -> None:
        f = self.combine(body, n, acc)
        if _expr_dtype(n) == torch.bool:
            body.emit(f"{f} = {f} != 0")
        self.axes[f] = frozenset({"x"})
        self.keep(body, n.name, f)
        if n.name not in self.k.local:
            b = self.k.layout(n.name, self.g)
            self.store(body, n.name, index_code(ir.linear(osyms, b.stride)), f, "xz", "xmask")

    # -- scatter ------------------------------------------------------------------------------
    def _scatter(self) -> KernelSource:
        """init: out = init(i); then out[index(v)] op= fn(v). A bf16/fp16 scatter-add sums in a
        float32 scratch (`acc`) and a third function rounds it into out: Triton has no 16-bit
        atomic_add on every target (its interpreter has none), and float32 sums are exacter."""
        n = self.k.nodes[0]
        out = self.g.buffers[n.name]
        acc = "acc" if n.reduce_op == "add" and out.dtype in LOW else ""
        init = Body(self, "    ")
        ssyms = self.syms.ranges("s", n.shape)
        self._split(init, "xindex", ssyms, n.shape, "x")
        v = init.value(n.init(ssyms))
        if acc:
            init.emit(f"tl.store({acc} + xindex, {v}, mask=xmask)")
        else:
            self.store(init, n.name, init.index(ir.linear(ssyms, out.stride)), v, "xz", "xmask")
        body = Body(self, "    ")
        vsyms = self.syms.ranges("v", n.rshape)
        self._split(body, "xindex", vsyms, n.rshape, "x")
        v = body.value(n.fn(vsyms))
        if acc:
            body.emit(f"tl.atomic_add({acc} + {body.index(n.index(vsyms))} + xz, {v}, "
                      f"mask=xmask)")
        else:
            self.store(body, n.name, body.index(n.index(vsyms)), v, "xz", "xmask",
                       atomic=n.reduce_op == "add")
        funcs = [("_init", init, _numel(n.shape)), ("", body, _numel(n.rshape))]
        scratch: tuple = ()
        if acc:
            cast = Body(self, "    ")
            self._split(cast, "xindex", ssyms, n.shape, "x")
            self.store(cast, n.name, cast.index(ir.linear(ssyms, out.stride)),
                       f"tl.load({acc} + xindex, mask=xmask)", "xz", "xmask")
            funcs.append(("_cast", cast, _numel(n.shape)))
            scratch = (Scratch(acc, _numel(n.shape), torch.float32),)
        src = tuple(self._func(suffix, b, size, scratch=scratch) for suffix, b, size in funcs)
        return KernelSource(self.k.name, src, tuple(self.params), "scatter", _numel(n.shape),
                            _numel(n.rshape), 0, scratch=scratch)


def _mode(kern: Kernel) -> str:
    if kern.kind == "scatter":
        return "scatter"
    if splittable(kern):
        return "split"
    if len(kern.loops) == 1 and all(n.kind == "pointwise" for n in kern.loops[0].steps):
        return "1d"
    return "2d"


def _needs_int64(kern: Kernel, g: LoweredGraph) -> bool:
    """int64 index math only when some buffer's extent or the iteration space passes int32."""
    bufs = {l.buf for n in kern.nodes for l in reads(n, g)} | {n.name for n in kern.nodes}
    for b in bufs:
        buf = g.buffers[b]
        extent = 1 + sum((s - 1) * abs(st) for s, st in zip(buf.shape, buf.stride) if s > 0)
        if extent > INT32_LIMIT:
            return True
    for n in kern.nodes:
        if _numel(n.shape) * max(_numel(n.rshape), 1) > INT32_LIMIT:
            return True
    return False


def _expr_dtype(n: ComputeNode) -> torch.dtype:
    syms = Symbols()  # a probe: its symbols meet no others
    return n.fn(syms.ranges("c", n.shape), syms.ranges("c", n.rshape)).dtype


def _acc_dtype(n: ComputeNode) -> torch.dtype:
    dt = compute(_expr_dtype(n))
    return torch.int32 if dt == torch.bool else dt


def _extreme(dtype: torch.dtype, lowest: bool) -> str:
    if dtype.is_floating_point:
        return "-1e999" if lowest else "1e999"
    info = torch.iinfo(dtype)
    return str(info.min if lowest else info.max)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _extremum(op: str, dt: torch.dtype) -> str:
    """The max/min combining two values of dtype dt as torch does: a NaN wins (one PTX
    max.NaN/min.NaN instruction), rather than tracking NaNs beside the accumulator."""
    if dt.is_floating_point:
        return "_max_nan" if op == "max" else "_min_nan"
    return "tl.maximum" if op == "max" else "tl.minimum"


def _reduce_extremum(op: str, dt: torch.dtype, tile: str) -> str:
    """A tile's rows reduced by _extremum. The interpreter runs a custom combine element by
    element in Python (the triton tests took twice as long): there, tl.max and a NaN test."""
    if not dt.is_floating_point:
        return f"tl.{op}({tile}, 1)"
    if _interpreting():
        return (f"tl.where(tl.max(({tile} != {tile}).to(tl.int32), 1) > 0, float('nan'), "
                f"tl.{op}({tile}, 1))")
    return f"tl.reduce({tile}, 1, {_extremum(op, dt)})"


PRELUDE = '''import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _floordiv(a, b):
    q = a // b
    return tl.where((a % b != 0) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def _mod(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def _expm1(x):
    # Kahan: (u - 1) * x / log(u) cancels the rounding error of u = exp(x)
    u = tl.exp(x)
    um1 = u - 1
    r = tl.where(u == 1, x, um1 * x / tl.log(u))
    r = tl.where(um1 == -1, -1.0, r)
    return tl.where((u == u) & (tl.abs(x) < 1e999), r, tl.where(x > 0, x, -1.0 + x * 0))


@triton.jit
def _log1p(x):
    u = 1 + x
    d = u - 1  # where 1 + x is exact (large x, +inf) the Kahan correction is 1: plain log
    return tl.where(u == 1, x, tl.where(d == x, tl.log(u), tl.log(u) * x / tl.where(u == 1, 1, d)))


@triton.jit
def _tanh(x):
    # The interpreter has no libdevice.tanh: evaluated in float64, so float32 results are
    # (nearly always) correctly rounded; saturated beyond 20 (also +-inf; NaN stays NaN).
    xd = x.to(tl.float64)
    e = _expm1(-2 * tl.abs(xd))
    t = tl.where(tl.abs(xd) > 20, 1.0, -e / (2 + e))
    return tl.where(xd < 0, -t, t).to(x.dtype)


@triton.jit
def _rne_bf16(x):
    # float32 -> bfloat16 rounded to nearest even, by its bits (used only under the interpreter:
    # its casts truncate and get subnormals wrong); NaN becomes c10's 0x7FC0
    u = x.to(tl.uint32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _bf16_f32(x):
    # bfloat16 -> float32 by its bits (used only under the interpreter)
    return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def _nearbyint(x):
    f = tl.floor(x)
    d = x - f
    odd = (f - 2 * tl.floor(f * 0.5)) != 0
    return tl.where(d > 0.5, f + 1, tl.where(d < 0.5, f, tl.where(odd, f + 1, f)))


@triton.jit
def _sign(a):
    # +-inf give +-1; NaN and -0.0 give 0, as torch.sign
    return tl.where(a > 0, 1, tl.where(a < 0, -1, 0)).to(a.dtype)


@triton.jit
def _ipow(a, b):
    # interpreter only (no libdevice there): C pow's sign and special cases around exp2/log2;
    # nested where, not &: the interpreter cannot broadcast & between 0-d and tile operands
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    odd = (b - 2 * tl.floor(b * 0.5)) != 0
    r = tl.where(a < 0, tl.where(tl.floor(b) == b, tl.where(odd, -r, r), float('nan')), r)
    r = tl.where(b == 0, 1.0, r)
    return tl.where(a == 1, 1.0, r)


@triton.jit
def _itan(x):
    return tl.sin(x) / tl.cos(x)


@triton.jit
def _isinh(x):
    return (_expm1(x) - _expm1(-x)) * 0.5


@triton.jit
def _icosh(x):
    return (tl.exp(x) + tl.exp(-x)) * 0.5


@triton.jit
def _ierfc(x):
    return 1.0 - tl.erf(x)


@triton.jit
def _prod(a, b):
    return a * b


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _argmax_combine(v1, i1, v2, i2):
    n1 = v1 != v1
    n2 = v2 != v2
    tie = (v1 == v2) | (n1 & n2)
    take = ((v2 > v1) & (n1 == 0)) | (n2 & (n1 == 0)) | (tie & (i2 < i1))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)


@triton.jit
def _argmin_combine(v1, i1, v2, i2):
    n1 = v1 != v1
    n2 = v2 != v2
    tie = (v1 == v2) | (n1 & n2)
    take = ((v2 < v1) & (n1 == 0)) | (n2 & (n1 == 0)) | (tie & (i2 < i1))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)
'''


def kernel_source(kern: Kernel, g: LoweredGraph, precise_div: bool = True) -> KernelSource:
    return KernelPrinter(kern, g, precise_div).source()
