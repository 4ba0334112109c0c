"""Indirect indexing lowerings: embedding, index_select, gather, index, index_put (scatter)."""
from __future__ import annotations

import sympy
import torch

from trainc.codegen import ir
from trainc.codegen.ir import Const, IndexValue, TensorValue
from trainc.codegen.lowerings import register
from trainc.codegen.lowerings.common import cast, const, expand, norm_dim, opmath
from trainc.codegen.symbols import indirect

aten = torch.ops.aten
I64 = torch.int64


def _ind(index: TensorValue, i, size: int) -> sympy.Symbol:
    return indirect(cast(index(i), I64), size)


@register(aten.embedding.default)
def embedding(ctx, node, weight, indices, padding_idx=-1, scale=False, sparse=False):
    out = node.meta["val"]
    k = len(indices.shape)
    return TensorValue(tuple(out.shape), out.dtype, lambda i: weight(
        [_ind(indices, i[:k], weight.shape[0])] + list(i[k:])))


@register(aten.index_select.default)
def index_select(ctx, node, x, dim, index):
    out = node.meta["val"]
    dim = norm_dim(dim, len(x.shape))

    def fn(i):
        i = list(i)
        if len(x.shape) == 0:
            return x([])
        i[dim] = _ind(index, [i[dim]] if index.shape else [], x.shape[dim])
        return x(i)
    return TensorValue(tuple(out.shape), out.dtype, fn)


@register(aten.gather.default)
def gather(ctx, node, x, dim, index, sparse_grad=False):
    out = node.meta["val"]
    dim = norm_dim(dim, len(x.shape))

    def fn(i):
        j = list(i)
        j[dim] = _ind(index, i, x.shape[dim])
        return x(j)
    return TensorValue(tuple(out.shape), out.dtype, fn)


def _leading(indices, x: TensorValue):
    """(k, broadcast shape) when indices are k non-None tensors on dims 0..k-1, else None."""
    k = 0
    while k < len(indices) and indices[k] is not None:
        k += 1
    if any(t is not None for t in indices[k:]) or k == 0:
        return None
    if any(t.dtype == torch.bool for t in indices[:k]):
        return None
    shape = tuple(torch.broadcast_shapes(*[torch.Size(t.shape) for t in indices[:k]]))
    return k, shape


@register(aten.index.Tensor)
def index(ctx, node, x, indices):
    lead = _leading(indices, x)
    if lead is None:
        return NotImplemented
    k, bshape = lead
    out = node.meta["val"]
    idx = [expand(t, bshape) for t in indices[:k]]
    nb = len(bshape)
    return TensorValue(tuple(out.shape), out.dtype, lambda i: x(
        [_ind(t, i[:nb], x.shape[d]) for d, t in enumerate(idx)] + list(i[nb:])))


@register(aten.index_put.default)
def index_put(ctx, node, x, indices, values, accumulate=False):
    lead = _leading(indices, x)
    if lead is None:
        return NotImplemented
    k, bshape = lead
    out = node.meta["val"]
    vshape = bshape + tuple(x.shape[k:])
    vals = expand(values, vshape)
    idx = [expand(t, bshape) for t in indices[:k]]
    nb = len(bshape)
    stride = ir.contiguous_strides(out.shape)

    def where(v):
        pos = [_ind(t, v[:nb], x.shape[d]) for d, t in enumerate(idx)] + list(v[nb:])
        return ir.linear(pos, stride)
    dt = opmath(out.dtype)
    return ctx.scatter(out.shape, out.dtype, lambda i: cast(x(i), dt), vshape,
                       lambda v: cast(vals(v), dt), where, "add" if accumulate else "store")


@register(aten.scatter_add.default)
def scatter_add(ctx, node, x, dim, index, src):
    if not x.shape:  # 0-d: no dim to index (cummax backward of a scalar); ATen runs it
        return NotImplemented
    out = node.meta["val"]
    dim = norm_dim(dim, len(x.shape))
    stride = ir.contiguous_strides(out.shape)
    dt = opmath(out.dtype)

    def where(v):
        pos = list(v)
        pos[dim] = _ind(index, v, x.shape[dim])
        return ir.linear(pos, stride)
    return ctx.scatter(out.shape, out.dtype, lambda i: cast(x(i), dt), index.shape,
                       lambda v: cast(src(v), dt), where, "add")


def _scatter_one(node, x, dim, index, value):
    """scatter with one index per row along `dim` (a one-hot, cross_entropy's backward): a
    pointwise select, out[q] = value(q') where index[q'] == q[dim] (q' = q at 0 along dim,
    inside index's extent), else x[q]. Several indices per row run in ATen (write order)."""
    if not x.shape or index.shape[dim] != 1:
        return NotImplemented
    out = node.meta["val"]
    dt = out.dtype

    def fn(q):
        qi = list(q)
        qi[dim] = sympy.Integer(0)
        hit = ir.op("eq", torch.bool, cast(index(qi), I64), IndexValue(q[dim]))
        for d, (n_i, n_x) in enumerate(zip(index.shape, x.shape)):
            if d != dim and n_i < n_x:
                hit = ir.op("and", torch.bool, hit,
                            ir.op("lt", torch.bool, IndexValue(q[d]), Const(n_i, I64)))
        return ir.op("where", dt, hit, cast(value(qi), dt), cast(x(q), dt))
    return TensorValue(tuple(out.shape), dt, fn)


@register(aten.scatter.value)
def scatter_value(ctx, node, x, dim, index, value):
    dim = norm_dim(dim, len(x.shape))
    return _scatter_one(node, x, dim, index, lambda qi: const(value, node.meta["val"].dtype))


@register(aten.scatter.src)
def scatter_src(ctx, node, x, dim, index, src):
    dim = norm_dim(dim, len(x.shape))
    return _scatter_one(node, x, dim, index, src)
