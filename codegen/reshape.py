"""Fusion across reshapes: a compute node viewed in another shape of the same size ([B, T, C] as
[B*T, C], [B*H, T, T] as [B, H, T, T]) so that it can join a kernel iterating that shape.
Its contiguous buffer keeps its shape and layout; only the kernel indexes it in the new shape.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import sympy

from trainc.codegen import ir
from trainc.codegen.graph import Buffer, ComputeNode
from trainc.codegen.symbols import Symbols


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def refines(a, b) -> bool:
    """Is one of the row-major shapes a and b a refinement of the other (each dim of the coarser
    one a run of dims of the finer one)? Then the index arithmetic between them is a split of
    one loop variable or an affine combination of several."""
    def cuts(shape):
        out, acc = set(), 1
        for s in reversed(shape):
            acc *= int(s)
            out.add(acc)
        return out
    ca, cb = cuts(a), cuts(b)
    return ca <= cb or cb <= ca


def target_shape(kern, n: ComputeNode) -> Optional[tuple[int, ...]]:
    """The shape n (for a reduction: its outer shape) must take to join `kern`, or None."""
    first, size = kern.nodes[0], _numel(n.shape)
    if size == 0:
        return None
    if kern.outer is None:  # the kernel holds same-shape pointwise nodes of first.shape
        if n.kind == "pointwise":
            return tuple(first.shape) if _numel(first.shape) == size else None
        for k in range(1, len(first.shape) + 1):  # a reduction's outer: a prefix of the space
            if _numel(first.shape[:k]) == size:
                return tuple(first.shape[:k])
        return None
    outer = tuple(kern.outer)
    if n.kind == "reduction":
        return outer if _numel(outer) == size else None
    if _numel(outer) == 0 or size % _numel(outer):
        return None
    rest = size // _numel(outer)
    for m in kern.nodes:  # the inner shape of a pointwise node already there: loops can merge
        if m.kind == "pointwise" and _numel(m.shape[len(outer):]) == rest:
            return outer + tuple(m.shape[len(outer):])
    acc = 1
    for k in range(len(n.shape) - 1, -1, -1):
        acc *= n.shape[k]
        if acc == rest:
            return outer + tuple(n.shape[k:])
    return outer + (rest,)


def refined_shape(n: ComputeNode, symbols: Symbols) -> Optional[tuple[int, ...]]:
    """n's shape with dims split where n's index arithmetic divides a loop variable (x // p and
    x % p, as in a cat of equal parts or heads split off a channel dim): the pieces become loop
    variables of their own and the indexing affine. None when nothing splits."""
    if n.kind != "pointwise" or not n.shape or _numel(n.shape) == 0:
        return None
    syms = symbols.shared("r", n.shape)
    cuts: dict = {s: set() for s in syms}
    for index in _indices(n.fn(syms)):
        for x in sympy.preorder_traversal(index):
            if isinstance(x, (ir.FloorDiv, ir.ModIndex)) and x.args[0] in cuts:
                c, size = int(x.args[1]), x.args[0].extent
                if 1 < c < size and size % c == 0:
                    cuts[x.args[0]].add(c)
    if not any(cuts.values()):
        return None
    shape: list[int] = []
    for s, size in zip(syms, n.shape):
        chain = [1]
        for c in sorted(cuts[s]):  # nested splits only: each cut divides the next
            if c % chain[-1] == 0:
                chain.append(c)
        chain.append(size)
        shape += [chain[k + 1] // chain[k] for k in range(len(chain) - 2, -1, -1)]
    return tuple(shape)


def _indices(e: ir.Expr) -> list:
    out = []
    for x in ir.walk(e):
        if isinstance(x, ir.Load):
            out.append(x.index)
        elif isinstance(x, ir.IndexValue):
            out.append(x.expr)
    return out


def reshaped(n: ComputeNode, shape: tuple[int, ...],
             buf: Buffer) -> Optional[tuple[ComputeNode, Buffer]]:
    """n computing the same data in `shape`, and its buffer's layout in that shape; None when
    the shapes do not refine each other or the buffer is not contiguous."""
    size = _numel(shape)
    if n.kind not in ("pointwise", "reduction") or size != _numel(n.shape) or size == 0:
        return None
    if not refines(n.shape, shape) or not _contiguous(buf):
        return None
    old, fn = tuple(n.shape), n.fn
    if n.kind == "pointwise":
        def new_fn(idx):
            return fn(ir.reshape_index(idx, shape, old))
    else:
        def new_fn(idx, r):
            return fn(ir.reshape_index(idx, shape, old), r)
    node = dataclasses.replace(n, shape=tuple(shape), fn=new_fn)
    return node, Buffer(buf.name, tuple(shape), ir.contiguous_strides(shape), buf.dtype, buf.kind)


def _contiguous(b: Buffer) -> bool:
    want = ir.contiguous_strides(b.shape)
    return all(s == 1 or x == y for s, x, y in zip(b.shape, b.stride, want))
