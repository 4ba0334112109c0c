"""Kernel loops -> expensive values (exp, erf, tanh, ...) an earlier loop of the same outer
iteration already computed; the printer keeps them in a per-thread array instead of
recomputing them (softmax's exp(x - max) feeds both its sum and its normalisation)."""
from __future__ import annotations

from dataclasses import dataclass

from trainc.codegen import ir

EXPENSIVE = frozenset("exp exp2 expm1 log log2 log1p erf erfc tanh sigmoid sin cos tan pow "
                      "atan asin acos sinh cosh".split())
MAX_ELEMENTS = 4096  # per array: one outer iteration's values stay in L1/L2
MAX_ARRAYS = 4


@dataclass(frozen=True)
class Reuse:
    expr: ir.Expr
    name: str  # the array
    first: int  # the loop that computes and stores it
    later: tuple[int, ...]  # loops that read it back


def plan_reuse(loops: list[list[ir.Expr]], extents: list[tuple], syms: list[list]) -> list[Reuse]:
    """`loops[k]`: the value expressions loop k prints; loops with equal `syms` share index
    symbols, so equal expressions are equal values."""
    seen: dict[ir.Expr, int] = {}
    uses: dict[ir.Expr, list[int]] = {}
    for k, exprs in enumerate(loops):
        n = 1
        for s in extents[k]:
            n *= int(s)
        if not syms[k] or n > MAX_ELEMENTS:
            continue
        here = {x for e in exprs for x in ir.walk(e)
                if isinstance(x, ir.Op) and x.name in EXPENSIVE}
        for x in here:
            if x in seen and syms[seen[x]] == syms[k]:
                uses.setdefault(x, []).append(k)
            else:
                seen.setdefault(x, k)
    chosen: list[Reuse] = []
    for x in sorted(uses, key=lambda x: -ir.size_of(1000, x)):
        if len(chosen) == MAX_ARRAYS:
            break
        if any(x in set(ir.walk(c.expr)) for c in chosen):
            continue  # inside a value already kept
        chosen.append(Reuse(x, f"rv{len(chosen)}", seen[x], tuple(uses[x])))
    return chosen
