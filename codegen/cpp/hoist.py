"""Kernel loops -> expensive values that vary only along the vectorized index (an NHWC batch
norm's per-channel rsqrt(var + eps), mean / N): the printer computes each once per kernel into a
small array before the parallel loop and the loops read it back. GCC cannot hoist them itself:
in scalar form they change with the innermost counter, so every element paid a sqrt and a
division. The values are computed by the same expressions, so results are bitwise unchanged."""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from trainc.codegen import ir
from trainc.codegen.cpp.reuse import EXPENSIVE

# ops worth a load instead: vector division and square root cost 10-20 cycles per vector
SLOW = EXPENSIVE | frozenset("truediv sqrt rsqrt reciprocal floordiv remainder".split())
MAX_ELEMENTS = 4096  # per array
MAX_ARRAYS = 16


@dataclass(frozen=True)
class Hoist:
    expr: ir.Expr
    name: str  # the array
    sym: sympy.Symbol  # the vectorized index the value depends on (at most)
    extent: int


def plan_hoists(loops: list[list[ir.Expr]], vsyms: list, extents: list[int],
                written: set[str]) -> list[Hoist]:
    """`loops[k]`: the value expressions loop k prints, vectorized along `vsyms[k]` (None: not
    vectorized) with `extents[k]` iterations; `written`: buffers the kernel itself writes (their
    values at kernel start are not the loop's)."""
    chosen: dict[tuple, Hoist] = {}
    for exprs, v, n in zip(loops, vsyms, extents):
        if v is None or n > MAX_ELEMENTS:
            continue
        free: dict[ir.Expr, bool] = {}
        for e in exprs:
            for x in _maximal(e, v, written, free):
                key = (x, v, n)  # a value free of any index is hoisted per loop symbol
                if key not in chosen and len(chosen) < MAX_ARRAYS and _slow(x) \
                        and x.dtype.is_floating_point:
                    chosen[key] = Hoist(x, f"hv{len(chosen)}", v, n)
    return list(chosen.values())


def _maximal(root: ir.Expr, v, written: set[str], free: dict) -> list[ir.Expr]:
    """Largest sub-expressions of root that depend on no index but v (root itself included)."""
    for x in ir.walk(root):
        free[x] = _invariant(x, v, written, free)
    if free[root]:
        return [root]
    out = []
    for x in ir.walk(root):
        if isinstance(x, ir.Op) and not free[x]:
            out += [a for a in x.args if free[a] and isinstance(a, ir.Op)]
    return out


def _invariant(x: ir.Expr, v, written: set[str], free: dict) -> bool:
    """x depends on no index but v and reads nothing the kernel writes (children done first)."""
    if isinstance(x, ir.Load):
        return x.buf not in written and _only(x.index, v)
    if isinstance(x, ir.IndexValue):
        return _only(x.expr, v)
    if isinstance(x, ir.Op):
        return all(free[a] for a in x.args)
    return True


def _only(index, v) -> bool:
    return sympy.sympify(index).free_symbols <= {v}


def _slow(x: ir.Expr) -> bool:
    return any(isinstance(y, ir.Op) and y.name in SLOW for y in ir.walk(x))
