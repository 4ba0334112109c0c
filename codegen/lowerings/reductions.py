"""Reduction lowerings: sum/mean/prod/amax/amin/argmax, var_mean, softmax, log_softmax,
logsumexp, cumsum and layer norm statistics (two-pass: the mean first, then centered squares)."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from trainc.codegen import ir
from trainc.codegen.ir import IndexValue, TensorValue
from trainc.codegen.lowerings import register
from trainc.codegen.lowerings.common import cast, const, expand, norm_dim, numel, opmath
from trainc.codegen.lowerings.views import reshape

aten = torch.ops.aten
F32 = torch.float32


def _dims(x: TensorValue, dims) -> list[int]:
    # A 0-d tensor accepts dim 0/-1 and reduces over nothing, like dims=None.
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0) or not x.shape:
        return list(range(len(x.shape)))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({norm_dim(d, len(x.shape)) for d in dims})


def reduce(ctx, x: TensorValue, dims: Sequence[int], op: str, dtype: torch.dtype,
           keepdim: bool = False, f: Optional[Callable] = None) -> TensorValue:
    """A buffer: `op` over `dims` of f(x[i]) (f sees the full index too), stored as `dtype`."""
    kept = [d for d in range(len(x.shape)) if d not in dims]
    shape = tuple(x.shape[d] for d in kept)
    rshape = tuple(x.shape[d] for d in dims)
    acc = opmath(dtype) if op in ("sum", "prod") else None

    def fn(i, r):
        full = [None] * len(x.shape)
        for d, v in zip(kept, i):
            full[d] = v
        for d, v in zip(dims, r):
            full[d] = v
        e = f(x(full), i) if f is not None else x(full)
        return cast(e, acc) if acc is not None else e
    out = ctx.reduction(shape, rshape, op, dtype, fn)
    return keep(out, x.shape, dims) if keepdim else out


def keep(v: TensorValue, full_shape, dims) -> TensorValue:
    return reshape(v, [1 if d in dims else s for d, s in enumerate(full_shape)])


def _divide(v: TensorValue, n: float, dtype: torch.dtype) -> TensorValue:
    """v / n, divided as eager divides (not times 1/n: the mean of equal values stays exact,
    which ties in a later max/min backward depend on). n <= 0 divides by 0 (NaN/inf)."""
    dt = opmath(dtype)
    c = const(max(float(n), 0.0), dt)
    return TensorValue(v.shape, dtype, lambda i: ir.op("truediv", dt, cast(v(i), dt), c))


@register(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, node, x, dims=None, keepdim=False, dtype=None):
    out = node.meta["val"]
    return reduce(ctx, _as(x, out.dtype), _dims(x, dims), "sum", out.dtype, keepdim)


def _as(x: TensorValue, dtype: torch.dtype) -> TensorValue:
    if x.dtype == dtype:
        return x
    return TensorValue(x.shape, dtype, lambda i: cast(x(i), opmath(dtype)))


@register(aten.mean.dim, aten.mean.default)
def mean(ctx, node, x, dims=None, keepdim=False, dtype=None):
    out = node.meta["val"]
    d = _dims(x, dims)
    s = reduce(ctx, _as(x, opmath(out.dtype)), d, "sum", opmath(out.dtype), keepdim)
    n = numel([x.shape[k] for k in d])
    return _divide(s, n, out.dtype)


@register(aten.prod.dim_int, aten.prod.default)
def prod(ctx, node, x, dim=None, keepdim=False, dtype=None):
    out = node.meta["val"]
    return reduce(ctx, _as(x, out.dtype), _dims(x, dim), "prod", out.dtype, keepdim)


@register(aten.amax.default, aten.amin.default)
def amax(ctx, node, x, dims=(), keepdim=False):
    op = "max" if node.target is aten.amax.default else "min"
    if numel(x.shape) == 0:
        return NotImplemented  # eager raises on empty max; let ATen say so
    return reduce(ctx, x, _dims(x, dims), op, x.dtype, keepdim)


@register(aten.any.dim, aten.any.default, aten.any.dims, aten.all.dim, aten.all.default)
def any_all(ctx, node, x, dim=None, keepdim=False):
    op = "max" if node.target.overloadpacket is aten.any else "min"
    xb = TensorValue(x.shape, torch.bool, lambda i: cast(x(i), torch.bool))
    if numel(x.shape) == 0:
        return NotImplemented
    return reduce(ctx, xb, _dims(x, dim), op, torch.bool, keepdim)


@register(aten.argmax.default, aten.argmin.default)
def argmax(ctx, node, x, dim=None, keepdim=False):
    if numel(x.shape) == 0:
        return NotImplemented
    op = "argmax" if node.target is aten.argmax.default else "argmin"
    if dim is None:
        out = reduce(ctx, reshape(x, [numel(x.shape)]), [0], op, torch.int64)
        return reshape(out, [1] * len(x.shape)) if keepdim else out
    return reduce(ctx, x, _dims(x, dim), op, torch.int64, keepdim)


@register(aten.max.dim, aten.min.dim)
def max_dim(ctx, node, x, dim, keepdim=False):
    if numel(x.shape) == 0:
        return NotImplemented
    is_max = node.target is aten.max.dim
    d = _dims(x, dim)
    values = reduce(ctx, x, d, "max" if is_max else "min", x.dtype, keepdim)
    indices = reduce(ctx, x, d, "argmax" if is_max else "argmin", torch.int64, keepdim)
    return values, indices


def _mean_var(ctx, x: TensorValue, dims, correction: float):
    """(mean, var) keepdim float buffers-backed values; two passes over x."""
    dt = opmath(x.dtype)
    n = numel([x.shape[d] for d in dims])
    xs = _as(x, dt)
    mean = _divide(reduce(ctx, xs, dims, "sum", dt, True), n, dt)
    full_mean = expand(mean, x.shape)
    centered = TensorValue(x.shape, dt, lambda i: ir.op("sub", dt, cast(x(i), dt), full_mean(i)))
    sq2 = TensorValue(x.shape, dt, lambda i: ir.op("mul", dt, centered(i), centered(i)))
    denom = n - correction
    var = _divide(reduce(ctx, sq2, dims, "sum", dt, True), denom, dt)
    return mean, var


@register(aten.var_mean.correction, aten.var.correction)
def var_mean(ctx, node, x, dims=None, *, correction=None, keepdim=False):
    d = _dims(x, dims)
    corr = 1 if correction is None else correction
    mean, var = _mean_var(ctx, x, d, corr)
    outs = node.meta["val"] if isinstance(node.meta["val"], (list, tuple)) else [node.meta["val"]]
    shape = tuple(outs[0].shape)
    var, mean = (TensorValue(v.shape, outs[0].dtype, v.fn) for v in (var, mean))
    var, mean = reshape(var, shape), reshape(mean, shape)
    return (var, mean) if node.target is aten.var_mean.correction else var


def _softmax_parts(ctx, x: TensorValue, dim: int):
    dt = opmath(x.dtype)
    dims = _dims(x, [dim])  # a 0-d tensor's dim 0/-1 reduces over nothing
    m = expand(reduce(ctx, x, dims, "max", dt, True), x.shape)
    shifted = TensorValue(x.shape, dt, lambda i: ir.op("sub", dt, cast(x(i), dt), cast(m(i), dt)))
    e = TensorValue(x.shape, dt, lambda i: ir.op("exp", dt, shifted(i)))
    s = expand(reduce(ctx, e, dims, "sum", dt, True), x.shape)
    return dt, shifted, e, s


@register(aten._softmax.default)
def softmax(ctx, node, x, dim, half_to_float=False):
    out = node.meta["val"]
    dt, _, e, s = _softmax_parts(ctx, x, norm_dim(dim, len(x.shape)))
    return TensorValue(x.shape, out.dtype, lambda i: ir.op("truediv", dt, e(i), s(i)))


@register(aten._log_softmax.default)
def log_softmax(ctx, node, x, dim, half_to_float=False):
    out = node.meta["val"]
    dt, shifted, _, s = _softmax_parts(ctx, x, norm_dim(dim, len(x.shape)))
    return TensorValue(x.shape, out.dtype, lambda i: ir.op(
        "sub", dt, shifted(i), ir.op("log", dt, s(i))))


@register(aten.logsumexp.default)
def logsumexp(ctx, node, x, dims, keepdim=False):
    out = node.meta["val"]
    d = _dims(x, dims)
    dt = opmath(out.dtype)
    mk = reduce(ctx, x, d, "max", dt, True)
    m = expand(mk, x.shape)
    # an all -inf row must give -inf, not NaN: shift by 0 where the max is infinite
    safe = lambda v: ir.op("where", dt, ir.op("isinf", torch.bool, v), const(0, dt), v)
    e = TensorValue(x.shape, dt, lambda i: ir.op("exp", dt, ir.op(
        "sub", dt, cast(x(i), dt), safe(cast(m(i), dt)))))
    s = reduce(ctx, e, d, "sum", dt, True)
    res = TensorValue(mk.shape, out.dtype, lambda i: ir.op(
        "add", dt, ir.op("log", dt, s(i)), safe(cast(mk(i), dt))))
    return res if keepdim else reshape(res, out.shape)


@register(aten._softmax_backward_data.default)
def softmax_backward(ctx, node, g, y, dim, input_dtype):
    out = node.meta["val"]
    dt = opmath(out.dtype)
    dim = norm_dim(dim, len(y.shape))
    gy = TensorValue(y.shape, dt, lambda i: ir.op("mul", dt, cast(g(i), dt), cast(y(i), dt)))
    s = expand(reduce(ctx, gy, [dim], "sum", dt, True), y.shape)
    return TensorValue(y.shape, out.dtype, lambda i: ir.op(
        "mul", dt, cast(y(i), dt), ir.op("sub", dt, cast(g(i), dt), s(i))))


@register(aten._log_softmax_backward_data.default)
def log_softmax_backward(ctx, node, g, y, dim, input_dtype):
    out = node.meta["val"]
    dt = opmath(out.dtype)
    dim = norm_dim(dim, len(y.shape))
    s = expand(reduce(ctx, _as(g, dt), [dim], "sum", dt, True), y.shape)
    return TensorValue(y.shape, out.dtype, lambda i: ir.op("sub", dt, cast(g(i), dt), ir.op(
        "mul", dt, ir.op("exp", dt, cast(y(i), dt)), s(i))))


@register(aten.native_layer_norm.default)
def native_layer_norm(ctx, node, x, normalized_shape, weight, bias, eps):
    out, mean_meta, rstd_meta = node.meta["val"]
    k = len(normalized_shape)
    dims = list(range(len(x.shape) - k, len(x.shape)))
    dt = opmath(out.dtype)
    mean, var = _mean_var(ctx, x, dims, 0)
    rstd = TensorValue(var.shape, dt, lambda i: ir.op(
        "rsqrt", dt, ir.op("add", dt, var(i), const(eps, dt))))
    fm, fr = expand(mean, x.shape), expand(rstd, x.shape)
    w = expand(weight, x.shape) if weight is not None else None
    b = expand(bias, x.shape) if bias is not None else None

    def fn(i):
        e = ir.op("mul", dt, ir.op("sub", dt, cast(x(i), dt), fm(i)), fr(i))
        if w is not None:
            e = ir.op("mul", dt, e, cast(w(i), dt))
        if b is not None:
            e = ir.op("add", dt, e, cast(b(i), dt))
        return e
    y = TensorValue(x.shape, out.dtype, fn)
    as_meta = lambda v, m: TensorValue(tuple(m.shape), m.dtype, reshape(v, m.shape).fn)
    return y, as_meta(mean, mean_meta), as_meta(rstd, rstd_meta)


MAX_SCAN = 1024  # longest cumsum dim computed as a triangular sum (quadratic work)


@register(aten.cumsum.default)
def cumsum(ctx, node, x, dim, *, dtype=None):
    """out[..., j, ...] = sum over r <= j of x[..., r, ...], added in eager's order (r up)."""
    out = node.meta["val"]
    if not x.shape:
        return _as(x, out.dtype)
    dim = norm_dim(dim, len(x.shape))
    n = x.shape[dim]
    if n > MAX_SCAN or numel(x.shape) * n > 2 ** 28:
        return NotImplemented  # quadratic work: ATen's scan
    acc = opmath(out.dtype)

    def fn(i, r):
        src = list(i)
        src[dim] = r[0]
        keep = ir.op("le", torch.bool, IndexValue(r[0]), IndexValue(i[dim]))
        return ir.op("where", acc, keep, cast(x(src), acc), const(0, acc))
    return ctx.reduction(tuple(out.shape), (n,), "sum", out.dtype, fn)
