"""Transposed stores of a lanes loop (a column reduction's pointwise result written transposed
for the next mm: contiguous along the reduced loop, strided across the vector lanes) go through
a small tile per block of reduced iterations, written back one contiguous row per lane.

One scalar store per element became one vector store per row (gpt backward: 75 -> 29 us per
kernel); values, accumulation order and results are unchanged."""
from __future__ import annotations

import sympy

from trainc.codegen import ir
from trainc.codegen.cpp.exprs import index_code
from trainc.codegen.symbols import Indirect

TILE = 16  # reduced iterations per block: one 64-byte row of float32 per lane
ROW = "tr"  # the loop variable of a block's iterations (the block's start is `tb`)


def tiled_stores(kern, g, lp, osyms, loop_syms, loop_extents, dims) -> dict[str, str]:
    """{node: its store index code} for the pointwise stores of lanes loop `lp` of kernel
    `kern` that step 1 along the innermost loop and not along the lanes; {} when the loop's
    innermost extent is not a multiple of TILE. (The plan, codegen/cpp/plan.py, asks only for
    plain lanes loops: no accumulator sets, unrolled tiny dims or thread split.)"""
    if not loop_syms or int(loop_extents[-1]) % TILE:
        return {}
    inner, lane = loop_syms[-1], osyms[-1]
    out = {}
    for n in lp.steps:
        if n.kind != "pointwise" or n.name in kern.local or n.name in kern.scratch:
            continue
        b = kern.layout(n.name, g)
        index = sympy.expand(ir.linear(osyms + list(dims), b.stride))
        if any(isinstance(s, Indirect) for s in index.free_symbols):
            continue
        if index.diff(inner) == 1 and index.diff(lane) != 1 and index.diff(lane).is_number:
            out[n.name] = index_code(index)
    return out


def open_block(body, ind: str, sym, size: int, lanes: int, tiles: dict[str, str],
               types: dict) -> None:
    """The innermost loop as blocks of TILE iterations, each with its tiles."""
    body.emit(f"{ind}for (int64_t tb = 0; tb < {size}; tb += {TILE}) {{")
    for name in tiles:
        body.emit(f"{ind}  alignas(64) {types[name]} {name}_t[{TILE}][{lanes}];")
    body.emit(f"{ind}  for (int64_t {ROW} = 0; {ROW} < {TILE}; ++{ROW}) {{")
    body.emit(f"{ind}    const int64_t {sym.name} = tb + {ROW};")


def write_block(body, ind: str, sym, lane, lanes: int, tiles: dict[str, str],
                params: dict) -> None:
    """After a block: each lane's row of every tile to memory, contiguous."""
    body.emit(f"{ind}for (int64_t j = 0; j < {lanes}; ++j) {{")
    body.emit(f"{ind}  const int64_t {lane.name} = lane0 + j;")
    body.emit(f"{ind}  #pragma omp simd")
    body.emit(f"{ind}  for (int64_t {ROW} = 0; {ROW} < {TILE}; ++{ROW}) {{")
    body.emit(f"{ind}    const int64_t {sym.name} = tb + {ROW};")
    for name, index in tiles.items():
        body.emit(f"{ind}    {params[name]}[{index}] = {name}_t[{ROW}][j];")
    body.emit(f"{ind}  }}")
    body.emit(f"{ind}}}")
