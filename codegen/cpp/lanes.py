"""Kernel -> which loop the C++ printer vectorizes: the innermost loop, or lanes of the last
outer dim (a block of W outer iterations run side by side, each with its own accumulator)."""
from __future__ import annotations

from typing import Optional

import sympy

from trainc.codegen import ir
from trainc.codegen.graph import Buffer, LoweredGraph
from trainc.codegen.scheduler import Kernel, Loop
from trainc.codegen.symbols import Symbols

LANE_WIDTHS = (64, 32, 16, 8)  # lanes per block: a divisor of the last outer dim, no tails
SCRATCH_LIMIT = 1 << 18  # bytes of per-thread scratch a lane block may take


def choose_lanes(kern: Kernel, g: LoweredGraph, osyms, loop_syms, loop_dims,
                 exprs, widths: tuple[int, ...] = LANE_WIDTHS) -> Optional[int]:
    """The lane count when the kernel's memory accesses are contiguous along its last outer dim
    more often than along its innermost loop dim (weighted by how often each runs), else None.
    `loop_syms[k]`: loop k's symbols; `loop_dims[k]`: its per-dim index expressions over them;
    `exprs`: each node's value over those; `widths`: lane counts to try, widest first."""
    if kern.kind != "loops" or not kern.outer:
        return None
    last = int(kern.outer[-1])
    width = next((w for w in widths if w <= last and last % w == 0), None)
    if width is None:
        return None
    scratch = sum(ir_bytes(kern.layout(b, g), len(kern.outer)) for b in kern.scratch) * width
    if scratch > SCRATCH_LIMIT:
        return None
    row = col = 0
    for lp, isyms, dims in zip(kern.loops, loop_syms, loop_dims):
        weight = max(_numel(lp.inner), 1)
        for n in lp.steps:
            indices = [l.index for l in ir.loads(exprs[n.name]) if l.buf not in kern.scratch]
            if n.kind == "pointwise" and n.name not in kern.local:
                indices.append(ir.linear(osyms + dims, kern.layout(n.name, g).stride))
            for index in indices:
                if isyms and not set(isyms) & sympy.sympify(index).free_symbols:
                    continue  # invariant in the loop: read once either way
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


def ir_bytes(b: Buffer, n_outer: int) -> int:
    return _numel(b.shape[n_outer:]) * b.dtype.itemsize


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def flatten_loop(lp: Loop, osyms, g: LoweredGraph, local: set[str], plain: list,
                 scope: Symbols, layouts: Optional[dict] = None):
    """(loop symbols, per-dim index expressions, loop extents) for a loop of pointwise steps:
    trailing inner dims merge into one loop when every access stays affine in the merged
    symbol (contiguous blocks), so the vectorized loop is long; otherwise one loop per dim
    (`plain`: the per-dim symbols loops of the same extents share; `scope`: the kernel's
    symbols; `layouts`: the kernel's reshaped buffers, Kernel.layouts)."""
    dims = list(lp.inner)
    if len(dims) < 2 or 0 in dims or any(n.kind != "pointwise" for n in lp.steps):
        return plain, plain, tuple(dims)
    for m in range(len(dims), 1, -1):
        merged = _numel(dims[-m:])
        f = scope.range("i", merged)
        subs, below = [], merged
        for size in dims[-m:]:
            below //= size
            subs.append(ir.FloorDiv(ir.ModIndex(f, below * size), below))
        syms = plain[:-m] + [f]
        index_of = plain[:-m] + subs
        if _affine_in(lp, osyms + index_of, f, g, local, layouts or {}):
            return syms, index_of, tuple(dims[:-m]) + (merged,)
    return plain, plain, tuple(dims)


def _affine_in(lp: Loop, index_of, f, g: LoweredGraph, local: set[str], layouts: dict) -> bool:
    for n in lp.steps:
        indices = [l.index for l in ir.loads(n.fn(index_of))]
        if n.name not in local:
            indices.append(ir.linear(index_of, (layouts.get(n.name) or g.buffers[n.name]).stride))
        for index in indices:
            for x in sympy.preorder_traversal(index):
                if isinstance(x, (ir.FloorDiv, ir.ModIndex, sympy.Min, sympy.Max)) and \
                        f in x.free_symbols:
                    return False
    return True
