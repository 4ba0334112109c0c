"""View lowerings: reshape, permute, expand, squeeze, slice, select, split, cat, pad, flip.

All become index arithmetic on the input's index function; strided views of buffers keep
their strides so extern kernels can take them without a copy.
"""
from __future__ import annotations

import sympy
import torch

from trainc.codegen import ir
from trainc.codegen.ir import Const, IndexValue, TensorValue
from trainc.codegen.lowerings import register
from trainc.codegen.lowerings.common import cast, const, expand, norm_dim, numel, opmath

aten = torch.ops.aten


def reshape(x: TensorValue, shape) -> TensorValue:
    shape = tuple(int(s) for s in shape)
    if shape == x.shape:
        return x
    if numel(shape) == 0:
        zero = ir.Const(0, x.dtype)
        return TensorValue(shape, x.dtype, lambda i: cast(zero, x.dtype))
    groups = ir.reshape_groups(x.shape, shape)

    def fn(idx):
        return x(ir.reshape_index(idx, shape, x.shape))
    stride = _view_strides(x, shape, groups) if x.view is not None else None
    if stride is None:
        return TensorValue(shape, x.dtype, fn)
    # A value with a StridedView reads its buffer directly: index it with the new strides.
    return ir.buffer_value(x.view.buf, shape, stride, x.dtype, x.view.offset)


def _view_strides(x: TensorValue, shape, groups):
    stride = [1] * len(shape)
    for oi, nj in groups:
        dims = [k for k in oi if x.shape[k] != 1]
        for a, b in zip(dims, dims[1:]):
            if x.view.stride[a] != x.view.stride[b] * x.shape[b]:
                return None
        base = x.view.stride[dims[-1]] if dims else 1
        for j, s in zip(nj, ir.contiguous_strides([shape[j] for j in nj])):
            stride[j] = s * base
    return tuple(stride)


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default)
def view(ctx, node, x, *args):
    return reshape(x, node.meta["val"].shape)


@register(aten.permute.default)
def permute(ctx, node, x, dims):
    return _permute(x, [norm_dim(d, len(x.shape)) for d in dims])


def _permute(x: TensorValue, perm) -> TensorValue:
    shape = tuple(x.shape[p] for p in perm)

    def fn(idx):
        old = [None] * len(perm)
        for k, p in enumerate(perm):
            old[p] = idx[k]
        return x(old)
    stride = [x.view.stride[p] for p in perm] if x.view is not None else None
    return ir.strided_view(x, shape, stride, 0, fn) if stride is not None else \
        TensorValue(shape, x.dtype, fn)


@register(aten.t.default, aten.transpose.int)
def transpose(ctx, node, x, d0=0, d1=1):
    perm = list(range(len(x.shape)))
    if len(perm) < 2:
        return x
    d0, d1 = norm_dim(d0, len(perm)), norm_dim(d1, len(perm))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permute(x, perm)


@register(aten.expand.default)
def expand_(ctx, node, x, size, implicit=False):
    return expand(x, node.meta["val"].shape)


@register(aten.slice.Tensor)
def slice_(ctx, node, x, dim=0, start=None, end=None, step=1):
    dim = norm_dim(dim, len(x.shape))
    start = _clamp_start(start, x.shape[dim])
    return _slice(x, dim, start, step, node.meta["val"].shape[dim])


def _clamp_start(start, size: int) -> int:
    start = 0 if start is None else int(start)
    start = start + size if start < 0 else start
    return min(max(start, 0), size)


def _slice(x: TensorValue, dim: int, start: int, step: int, length: int) -> TensorValue:
    shape = list(x.shape)
    shape[dim] = int(length)

    def fn(idx):
        idx = list(idx)
        idx[dim] = idx[dim] * step + start
        return x(idx)
    if x.view is None:
        return TensorValue(tuple(shape), x.dtype, fn)
    stride = list(x.view.stride)
    stride[dim] *= step
    return ir.strided_view(x, shape, stride, start * x.view.stride[dim], fn)


@register(aten.select.int)
def select(ctx, node, x, dim, index):
    dim = norm_dim(dim, len(x.shape))
    index = int(index) + (x.shape[dim] if int(index) < 0 else 0)
    shape = x.shape[:dim] + x.shape[dim + 1:]

    def fn(idx):
        return x(list(idx[:dim]) + [sympy.Integer(index)] + list(idx[dim:]))
    if x.view is None:
        return TensorValue(shape, x.dtype, fn)
    stride = x.view.stride[:dim] + x.view.stride[dim + 1:]
    return ir.strided_view(x, shape, stride, index * x.view.stride[dim], fn)


@register(aten.split_with_sizes.default, aten.split.Tensor)
def split(ctx, node, x, sizes, dim=0):
    dim = norm_dim(dim, len(x.shape))
    if isinstance(sizes, int):
        n = x.shape[dim]
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)] or [0]
    outs, start = [], 0
    for s in sizes:
        outs.append(_slice(x, dim, start, 1, s))
        start += s
    return outs


@register(aten.cat.default)
def cat(ctx, node, tensors, dim=0):
    out = node.meta["val"]
    dim = norm_dim(dim, out.dim())
    parts = [t for t in tensors if numel(t.shape) > 0 or len(t.shape) == out.dim()]
    parts = [t for t in parts if t.shape[dim] > 0] or parts[:1]
    offsets, acc = [], 0
    for t in parts:
        offsets.append(acc)
        acc += t.shape[dim]
    dt = opmath(out.dtype)
    if len(parts) > 1 and len({t.shape[dim] for t in parts}) == 1:
        return _cat_equal(parts, dim, tuple(out.shape), out.dtype)

    def fn(idx):
        def piece(k):
            i = list(idx)
            i[dim] = _in_bounds(idx[dim], offsets[k], parts[k].shape[dim], out.shape[dim]) \
                if len(parts) > 1 else idx[dim]
            return cast(parts[k](i), dt)
        e = piece(len(parts) - 1)
        for k in range(len(parts) - 2, -1, -1):
            below = ir.op("lt", torch.bool, IndexValue(idx[dim]),
                          Const(offsets[k + 1], torch.int64))
            e = ir.op("where", dt, below, piece(k), e)
        return e
    return TensorValue(tuple(out.shape), out.dtype, fn)


def _cat_equal(parts, dim: int, shape, dtype) -> TensorValue:
    """cat of equal-size parts: position i of the dim is element i % p of part i // p, so every
    part is read in bounds without clamping (a scheduler that splits the dim into
    (parts, p) then indexes them all contiguously and picks one per outer iteration)."""
    p, dt = parts[0].shape[dim], opmath(dtype)

    def fn(idx):
        which = IndexValue(ir.FloorDiv(idx[dim], p))
        i = list(idx)
        i[dim] = ir.ModIndex(idx[dim], p)
        e = cast(parts[-1](i), dt)
        for k in range(len(parts) - 2, -1, -1):
            is_k = ir.op("eq", torch.bool, which, Const(k, torch.int64))
            e = ir.op("where", dt, is_k, cast(parts[k](i), dt), e)
        return e
    return TensorValue(shape, dtype, fn)


def _in_bounds(i, offset: int, size: int, extent: int, step: int = 1):
    """(i - offset) // step clamped into [0, size - 1], for an index i in [0, extent): only the
    bounds i can cross are spelled, as unevaluated Max/Min (sympy evaluating them against index
    expressions was most of a Llama backward's codegen time)."""
    k = i - offset
    if offset > 0:
        k = sympy.Max(k, 0, evaluate=False)
    if step != 1:
        k = ir.FloorDiv(k, step)
    if (extent - 1 - offset) // step > size - 1:
        k = sympy.Min(k, size - 1, evaluate=False)
    return k


@register(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, node, x, pad, value=0):
    out = node.meta["val"]
    dt = opmath(out.dtype)
    n = len(x.shape)
    lows = {n - 1 - k // 2: int(pad[k]) for k in range(0, len(pad), 2)}
    fill = const(value, out.dtype)

    def fn(idx):
        src, conds = list(idx), []
        for d, lo in lows.items():
            size = x.shape[d]
            src[d] = _in_bounds(idx[d], lo, max(size, 1), out.shape[d])
            i = IndexValue(idx[d])
            if lo > 0:
                conds.append(ir.op("ge", torch.bool, i, Const(lo, torch.int64)))
            if lo + size < out.shape[d]:
                conds.append(ir.op("lt", torch.bool, i, Const(lo + size, torch.int64)))
        e = cast(x(src), dt)
        for c in conds:
            e = ir.op("where", dt, c, e, fill)
        return e
    return TensorValue(tuple(out.shape), out.dtype, fn)


@register(aten.slice_scatter.default)
def slice_scatter(ctx, node, base, src, dim=0, start=None, end=None, step=1):
    """base with src written over base[start:end:step] along dim (the backward of a slice)."""
    dim = norm_dim(dim, len(base.shape))
    start, step, length = _clamp_start(start, base.shape[dim]), int(step), src.shape[dim]
    if length == 0:
        return base
    dt = node.meta["val"].dtype

    def fn(idx):
        at = list(idx)  # the src position, where idx is in the slice
        at[dim] = _in_bounds(idx[dim], start, length, base.shape[dim], step)
        i = IndexValue(idx[dim])
        hit = ir.op("and", torch.bool, ir.op("ge", torch.bool, i, Const(start, torch.int64)),
                    ir.op("lt", torch.bool, i, Const(start + (length - 1) * step + 1,
                                                      torch.int64)))
        if step > 1:
            hit = ir.op("and", torch.bool, hit, ir.op("eq", torch.bool, IndexValue(
                ir.ModIndex(sympy.Max(idx[dim] - start, 0, evaluate=False), step)),
                Const(0, torch.int64)))
        return ir.op("where", dt, hit, cast(src(at), dt), cast(base(idx), dt))
    return TensorValue(tuple(base.shape), dt, fn)


@register(aten.select_scatter.default)
def select_scatter(ctx, node, base, src, dim, index):
    """base with src written over base.select(dim, index) (the backward of a select)."""
    dim = norm_dim(dim, len(base.shape))
    index = int(index) + (base.shape[dim] if int(index) < 0 else 0)
    dt = node.meta["val"].dtype

    def fn(idx):
        hit = ir.op("eq", torch.bool, IndexValue(idx[dim]), Const(index, torch.int64))
        return ir.op("where", dt, hit, cast(src(list(idx[:dim]) + list(idx[dim + 1:])), dt),
                     cast(base(idx), dt))
    return TensorValue(tuple(base.shape), dt, fn)


@register(aten.flip.default)
def flip(ctx, node, x, dims):
    dims = {norm_dim(d, len(x.shape)) for d in dims}

    def fn(idx):
        return x([x.shape[d] - 1 - i if d in dims else i for d, i in enumerate(idx)])
    return TensorValue(x.shape, x.dtype, fn)
