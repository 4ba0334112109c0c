"""Kernel -> which loop the C++ printer vectorizes: the innermost loop, or lanes of the last
outer dim (a block of W outer iterations run side by side, each with its own accumulator)."""
from __future__ import annotations

from typing import Optional

import sympy

from trainc.codegen import ir
from trainc.codegen.graph import LoweredGraph
from trainc.codegen.scheduler import Kernel

LANE_WIDTHS = (64, 32, 16, 8)  # lanes per block: a divisor of the last outer dim, no tails
SCRATCH_LIMIT = 1 << 18  # bytes of per-thread scratch a lane block may take


def choose_lanes(kern: Kernel, g: LoweredGraph, osyms, loop_syms, exprs) -> Optional[int]:
    """The lane count when the kernel's memory accesses are contiguous along its last outer dim
    more often than along its innermost loop dim (weighted by how often each runs), else None.
    `loop_syms[k]`: loop k's index symbols; `exprs`: each node's value over those symbols."""
    if kern.kind != "loops" or not kern.outer:
        return None
    last = int(kern.outer[-1])
    width = next((w for w in LANE_WIDTHS if w <= last and last % w == 0), None)
    if width is None:
        return None
    scratch = sum(ir_bytes(g, b, len(kern.outer)) for b in kern.scratch) * width
    if scratch > SCRATCH_LIMIT:
        return None
    row = col = 0
    for lp, isyms in zip(kern.loops, loop_syms):
        weight = max(_numel(lp.inner), 1)
        for n in lp.steps:
            indices = [l.index for l in ir.loads(exprs[n.name]) if l.buf not in kern.scratch]
            if n.kind == "pointwise" and n.name not in kern.local:
                indices.append(ir.linear(osyms + isyms, g.buffers[n.name].stride))
            for index in indices:
                if isyms and _unit(index, isyms[-1]):
                    row += weight
                elif _unit(index, osyms[-1]):
                    col += weight
    return width if col > row else None


def _unit(index, sym: sympy.Symbol) -> bool:
    """Does `index` step by exactly one element when `sym` does? (only affine uses count)"""
    coeff = 0
    for term in sympy.Add.make_args(index):
        if term == sym:
            coeff += 1
        elif term.is_Mul and sym in term.args and len(term.args) == 2:
            c = term.args[0] if term.args[1] == sym else term.args[1]
            if not c.is_Integer:
                return False
            coeff += int(c)
        elif sym in term.free_symbols:
            return False
    return coeff == 1


def ir_bytes(g: LoweredGraph, buf: str, n_outer: int) -> int:
    b = g.buffers[buf]
    return _numel(b.shape[n_outer:]) * b.dtype.itemsize


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
