"""Reductions in Triton: accumulator tiles, their per-element update, and the combine along a
row. Functions of a KernelPrinter `p` (codegen/triton/printer.py), shared by the split stages
(split.py). max/min propagate NaN as torch does; argmax/argmin take the first index on ties.
"""
from __future__ import annotations

import torch

from trainc.codegen import ir
from trainc.codegen.graph import ComputeNode
from trainc.codegen.symbols import Symbols
from trainc.codegen.triton.exprs import TL, Body, _interpreting, compute, index_code

BIG_INDEX = 2**62  # argmax lanes that have not seen a value yet


def acc_init(p, body: Body, n: ComputeNode, width: str) -> list[str]:
    """The accumulator tile(s) of reduction n, [XBLOCK, width], set to the op's identity."""
    dt = acc_dtype(n)
    acc = p.tmp()
    shape = f"[XBLOCK, {width}]"
    op = n.reduce_op
    if op in ("sum", "prod"):
        body.emit(f"{acc} = tl.full({shape}, {0 if op == 'sum' else 1}, {TL[dt]})")
        return [acc]
    init = extreme(dt, op in ("max", "argmax"))
    body.emit(f"{acc} = tl.full({shape}, {init}, {TL[dt]})")
    if op in ("max", "min"):
        return [acc]
    body.emit(f"{acc}i = tl.full({shape}, {BIG_INDEX}, tl.int64)")
    return [acc, acc + "i"]


def accumulate(p, body: Body, n: ComputeNode, acc: list[str], e: ir.Expr, rindex: str) -> None:
    """acc op= e on the tile's valid elements."""
    v = body.value(e)
    if e.dtype == torch.bool:
        v = f"{v}.to(tl.int32)"
    if not p.axes.get(v) and v.startswith("t"):  # a scalar: give it the tile's shape
        b = p.tmp()
        body.emit(f"{b} = {v} + tl.zeros_like({acc[0]})")
        v = b
    m = f"xmask & {p.rmask}"
    a = acc[0]
    op = n.reduce_op
    if op == "sum":
        body.emit(f"{a} = {a} + tl.where({m}, {v}, 0)")
    elif op == "prod":
        body.emit(f"{a} = {a} * tl.where({m}, {v}, 1)")
    elif op in ("max", "min"):
        body.emit(f"{a} = tl.where({m}, {extremum(op, acc_dtype(n))}({a}, {v}), {a})")
    else:
        cmp = ">" if op == "argmax" else "<"
        take = p.tmp()
        body.emit(f"{take} = {m} & (({v} {cmp} {a}) | (({v} != {v}) & ({a} == {a})) | "
                  f"({acc[1]} == {BIG_INDEX}))")
        body.emit(f"{a} = tl.where({take}, {v}, {a})")
        body.emit(f"{acc[1]} = tl.where({take}, {rindex} + xz, {acc[1]})")


def combine(p, body: Body, n: ComputeNode, acc: list[str]) -> str:
    """The accumulator tile of reduction n reduced along its row: a [XBLOCK, 1] variable
    (max/min: NaN where any element was NaN)."""
    f = p.tmp()
    op, a = n.reduce_op, acc[0]
    if op == "sum":
        body.emit(f"{f} = tl.sum({a}, 1)[:, None]")
    elif op == "prod":
        body.emit(f"{f} = tl.reduce({a}, 1, _prod)[:, None]")
    elif op in ("max", "min"):
        body.emit(f"{f} = {reduce_extremum(op, acc_dtype(n), a)}[:, None]")
    else:
        body.emit(f"_, {f} = tl.reduce(({a}, {acc[1]}), 1, _{op}_combine)")
        body.emit(f"{f} = {f}[:, None]")
    return f


def finish(p, body: Body, n: ComputeNode, acc: list[str], osyms) -> None:
    """Combine reduction n's row, keep its value for later steps, store it unless local."""
    f = combine(p, body, n, acc)
    if expr_dtype(n) == torch.bool:
        body.emit(f"{f} = {f} != 0")
    p.axes[f] = frozenset({"x"})
    p.keep(body, n.name, f)
    if n.name not in p.k.local:
        b = p.k.layout(n.name, p.g)
        p.store(body, n.name, index_code(ir.linear(osyms, b.stride)), f, "xz", "xmask")


def expr_dtype(n: ComputeNode) -> torch.dtype:
    syms = Symbols()  # a probe: its symbols meet no others
    return n.fn(syms.ranges("c", n.shape), syms.ranges("c", n.rshape)).dtype


def acc_dtype(n: ComputeNode) -> torch.dtype:
    dt = compute(expr_dtype(n))
    return torch.int32 if dt == torch.bool else dt


def extreme(dtype: torch.dtype, lowest: bool) -> str:
    if dtype.is_floating_point:
        return "-1e999" if lowest else "1e999"
    info = torch.iinfo(dtype)
    return str(info.min if lowest else info.max)


def extremum(op: str, dt: torch.dtype) -> str:
    """The max/min combining two values of dtype dt as torch does: a NaN wins (one PTX
    max.NaN/min.NaN instruction), rather than tracking NaNs beside the accumulator."""
    if dt.is_floating_point:
        return "_max_nan" if op == "max" else "_min_nan"
    return "tl.maximum" if op == "max" else "tl.minimum"


def reduce_extremum(op: str, dt: torch.dtype, tile: str) -> str:
    """A tile's rows reduced by extremum. The interpreter runs a custom combine element by
    element in Python (the triton tests took twice as long): there, tl.max and a NaN test."""
    if not dt.is_floating_point:
        return f"tl.{op}({tile}, 1)"
    if _interpreting():
        return (f"tl.where(tl.max(({tile} != {tile}).to(tl.int32), 1) > 0, float('nan'), "
                f"tl.{op}({tile}, 1))")
    return f"tl.reduce({tile}, 1, {extremum(op, dt)})"
