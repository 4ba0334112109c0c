"""Pointwise kernels that read along one dim and write along another: square-ish tiles.

A 1-D program over a transposing copy reads (or writes) every element `stride` apart; tiled
[XBLOCK // TILE_X, TILE_X] over the two dims, each side's accesses are contiguous and Triton
moves the tile between the layouts through shared memory. Chosen only where both dims divide
evenly, so the 1-D launch (XBLOCK elements a program) and its masks stay as they are.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import sympy

from trainc.codegen import ir

TILE_X = 32  # the store's contiguous side; the other side is XBLOCK // TILE_X (16 or 32)
MIN_ELEMENTS = 1 << 16  # the 1-D launcher then picks XBLOCK >= 512 (heuristic and candidates)


def transposed_dims(syms: Sequence, shape: Sequence[int], stores: Sequence[ir.Index],
                    loads: Sequence[ir.Index],
                    min_elements: int = MIN_ELEMENTS) -> Optional[tuple[int, int]]:
    """(store dim, load dim) when every store is contiguous along one dim and some affine load
    along another, both dividing into tiles, in a loop of at least `min_elements`; None
    otherwise."""
    if math.prod(shape) < min_elements or not stores:
        return None
    store_dims = {_unit_dim(syms, idx) for idx in stores}
    if len(store_dims) != 1 or None in store_dims:
        return None
    a = store_dims.pop()
    for idx in loads:
        b = _unit_dim(syms, idx)
        if b is not None and b != a and shape[a] % TILE_X == 0 and shape[b] % TILE_X == 0:
            return a, b
    return None


def tile_lines(syms: Sequence, shape: Sequence[int], a: int, b: int, pid: str) -> list[str]:
    """Index symbols of one [XBLOCK // TILE_X, TILE_X] tile: dim a along the tile's columns,
    dim b along its rows, the other dims from the program id."""
    ty = f"(XBLOCK // {TILE_X})"
    na = shape[a] // TILE_X
    lines = [f"tile = {pid}", f"ta = tile % {na}", f"tb = (tile // {na}) % ({shape[b]} // {ty})",
             f"rest = tile // {na} // ({shape[b]} // {ty})",
             f"{syms[a].name} = ta * {TILE_X} + tl.arange(0, {TILE_X})[None, :]",
             f"{syms[b].name} = tb * {ty} + tl.arange(0, {ty})[:, None]"]
    others = [d for d in range(len(shape)) if d not in (a, b)]
    strides = ir.contiguous_strides([shape[d] for d in others])
    for d, st in zip(others, strides):
        lines.append(f"{syms[d].name} = (rest // {st}) % {shape[d]}")
    return lines


def _unit_dim(syms: Sequence, idx: ir.Index) -> Optional[int]:
    """The dim along which an affine index moves by one element; None if not affine or none."""
    idx = sympy.sympify(idx)
    coeffs = [idx.coeff(s) for s in syms]
    rest = idx - sum(c * s for c, s in zip(coeffs, syms))
    if rest.free_symbols or any(not c.is_number for c in coeffs):
        return None
    unit = [d for d, c in enumerate(coeffs) if c == 1]
    return unit[0] if len(unit) == 1 else None

