"""Pointwise lowerings: arithmetic, math, comparisons, logic, where, casts, fills, RNG."""
from __future__ import annotations

import math

import sympy
import torch

from trainc.codegen import ir
from trainc.codegen.ir import IndexValue, TensorValue
from trainc.codegen.lowerings import register
from trainc.codegen.lowerings.common import (as_value, cast, const, expand, opmath, pointwise,
                                             promoted)

aten = torch.ops.aten
F32 = torch.float32


def _unary(name: str):
    def lower(ctx, node, x, *rest, **kw):
        dt = opmath(node.meta["val"].dtype)
        return pointwise(node, lambda a: ir.op(name, dt, a), x)
    return lower


_UNARY = {
    "exp": aten.exp, "exp2": aten.exp2, "expm1": aten.expm1, "log": aten.log, "log2": aten.log2,
    "log1p": aten.log1p, "sqrt": aten.sqrt, "rsqrt": aten.rsqrt, "sin": aten.sin,
    "cos": aten.cos, "tan": aten.tan, "tanh": aten.tanh, "sigmoid": aten.sigmoid,
    "erf": aten.erf, "erfc": aten.erfc, "atan": aten.atan, "asin": aten.asin,
    "acos": aten.acos, "sinh": aten.sinh, "cosh": aten.cosh, "floor": aten.floor,
    "ceil": aten.ceil, "trunc": aten.trunc, "neg": aten.neg, "abs": aten.abs,
    "sign": aten.sign, "reciprocal": aten.reciprocal, "bitwise_not": aten.bitwise_not,
}
for _name, _op in _UNARY.items():
    register(_op.default)(_unary(_name))
register(aten.round.default)(_unary("round"))


@register(aten.logical_not.default)
def logical_not(ctx, node, x):
    return pointwise(node, lambda a: ir.op("not", torch.bool, cast(a, torch.bool)), x,
                     compute=torch.bool)


def _binary(name: str):
    def lower(ctx, node, a, b, **kw):
        dt = opmath(node.meta["val"].dtype)
        return pointwise(node, lambda x, y: ir.op(name, dt, x, y), a, b)
    return lower


_BINARY = {
    "mul": aten.mul, "maximum": aten.maximum, "minimum": aten.minimum, "pow": aten.pow,
    "bitwise_and": aten.bitwise_and, "bitwise_or": aten.bitwise_or,
    "bitwise_xor": aten.bitwise_xor, "remainder": aten.remainder,
}
for _name, _op in _BINARY.items():
    for _ov in ("Tensor", "Scalar", "Tensor_Scalar", "Tensor_Tensor", "Scalar_Tensor",
                "default"):
        if hasattr(_op, _ov):
            register(getattr(_op, _ov))(_binary(_name))


@register(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def add_sub(ctx, node, a, b, alpha=1):
    dt = opmath(node.meta["val"].dtype)
    name = "add" if node.target in (aten.add.Tensor, aten.add.Scalar) else "sub"

    def f(x, y):
        if alpha != 1:
            y = ir.op("mul", dt, y, const(alpha, dt))
        return ir.op(name, dt, x, y)
    return pointwise(node, f, a, b)


@register(aten.rsub.Scalar, aten.rsub.Tensor)
def rsub(ctx, node, a, b, alpha=1):
    dt = opmath(node.meta["val"].dtype)
    return pointwise(node, lambda x, y: ir.op("sub", dt, y, ir.op("mul", dt, x, const(alpha, dt))
                                              if alpha != 1 else x), a, b)


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(ctx, node, a, b, rounding_mode=None):
    out = node.meta["val"].dtype
    if rounding_mode is None:
        dt = opmath(out)
        return pointwise(node, lambda x, y: ir.op("truediv", dt, x, y), a, b)
    name = "floordiv" if rounding_mode == "floor" else "truncdiv"
    if name == "truncdiv":
        if out.is_floating_point:
            dt = opmath(out)
            return pointwise(node, lambda x, y: ir.op("trunc", dt, ir.op("truediv", dt, x, y)),
                             a, b)
        return NotImplemented
    return pointwise(node, lambda x, y: ir.op("floordiv", opmath(out), x, y), a, b)


@register(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(ctx, node, a, b):
    dt = opmath(node.meta["val"].dtype)
    return pointwise(node, lambda x, y: ir.op("floordiv", dt, x, y), a, b)


def _compare(name: str):
    def lower(ctx, node, a, b):
        dt = opmath(promoted(node, 0, 1))
        return pointwise(node, lambda x, y: ir.op(name, torch.bool, x, y), a, b, compute=dt)
    return lower


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    for _ov in ("Tensor", "Scalar"):
        register(getattr(getattr(aten, _name), _ov))(_compare(_name))


def _logical(name: str):
    def lower(ctx, node, a, b):
        return pointwise(node, lambda x, y: ir.op(name, torch.bool, x, y), a, b,
                         compute=torch.bool)
    return lower


register(aten.logical_and.default)(_logical("and"))
register(aten.logical_or.default)(_logical("or"))
register(aten.logical_xor.default)(_logical("xor"))


@register(aten.isnan.default, aten.isinf.default)
def isnan_isinf(ctx, node, x):
    name = "isnan" if node.target is aten.isnan.default else "isinf"
    return pointwise(node, lambda a: ir.op(name, torch.bool, a), x, compute=opmath(x.dtype))


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx, node, c, a, b):
    dt = opmath(node.meta["val"].dtype)
    return _where(node, as_value(c, torch.bool), a, b, dt)


def _where(node, cond, a, b, dt):
    out = node.meta["val"]
    shape = tuple(out.shape)
    k, x, y = (expand(as_value(v, d), shape) for v, d in ((cond, torch.bool), (a, dt), (b, dt)))
    return TensorValue(shape, out.dtype, lambda i: ir.op(
        "where", dt, cast(k(i), torch.bool), cast(x(i), dt), cast(y(i), dt)))


@register(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default)
def clamp(ctx, node, x, lo=None, hi=None):
    if node.target is aten.clamp_max.default:
        lo, hi = None, lo
    dt = opmath(node.meta["val"].dtype)
    shape = tuple(node.meta["val"].shape)
    xv = expand(x, shape)
    bounds = [(expand(as_value(v, dt), shape), name) for v, name in ((lo, "max"), (hi, "min"))
              if v is not None]

    def fn(i):
        e = cast(xv(i), dt)
        for v, name in bounds:  # maximum/minimum propagate NaN, as clamp does
            e = ir.op("maximum" if name == "max" else "minimum", dt, e, cast(v(i), dt))
        return e
    return TensorValue(shape, node.meta["val"].dtype, fn)


@register(aten.hardtanh.default)
def hardtanh(ctx, node, x, lo=-1, hi=1):
    """ReLU6 and friends: clamp(x, lo, hi), NaN kept (eager's hardtanh is clamp)."""
    return clamp(ctx, node, x, lo, hi)


@register(aten.relu.default)
def relu(ctx, node, x):
    dt = opmath(node.meta["val"].dtype)
    return pointwise(node, lambda a: ir.op("maximum", dt, a, const(0, dt)), x)


@register(aten.gelu.default)
def gelu(ctx, node, x, approximate="none"):
    dt = opmath(node.meta["val"].dtype)
    m = lambda a, b: ir.op("mul", dt, a, b)
    c = lambda v: const(v, dt)
    if approximate == "tanh":
        def f(a):
            inner = m(c(math.sqrt(2 / math.pi)), ir.op("add", dt, a, m(c(0.044715), m(a, m(a, a)))))
            return m(m(c(0.5), a), ir.op("add", dt, c(1), ir.op("tanh", dt, inner)))
    else:
        def f(a):
            return m(m(c(0.5), a), ir.op("add", dt, c(1), ir.op("erf", dt, m(a, c(0.5 ** 0.5)))))
    return pointwise(node, f, x)


@register(aten.gelu_backward.default)
def gelu_backward(ctx, node, g, x, approximate="none"):
    if approximate != "none":
        return NotImplemented
    dt = opmath(node.meta["val"].dtype)
    m = lambda a, b: ir.op("mul", dt, a, b)
    c = lambda v: const(v, dt)

    def f(gr, a):
        cdf = m(c(0.5), ir.op("add", dt, c(1), ir.op("erf", dt, m(a, c(0.5 ** 0.5)))))
        pdf = m(c(1 / math.sqrt(2 * math.pi)), ir.op("exp", dt, m(c(-0.5), m(a, a))))
        return m(gr, ir.op("add", dt, cdf, m(a, pdf)))
    return pointwise(node, f, g, x)


@register(aten.sigmoid_backward.default)
def sigmoid_backward(ctx, node, g, y):
    dt = opmath(node.meta["val"].dtype)
    return pointwise(node, lambda a, b: ir.op("mul", dt, a, ir.op(
        "mul", dt, b, ir.op("sub", dt, const(1, dt), b))), g, y)


@register(aten.tanh_backward.default)
def tanh_backward(ctx, node, g, y):
    dt = opmath(node.meta["val"].dtype)
    return pointwise(node, lambda a, b: ir.op("mul", dt, a, ir.op(
        "sub", dt, const(1, dt), ir.op("mul", dt, b, b))), g, y)


@register(aten._to_copy.default, aten.clone.default, aten.alias.default,
          aten.lift_fresh_copy.default, aten.detach.default)
def to_copy(ctx, node, x, **kw):
    out = node.meta["val"]
    if not isinstance(x, TensorValue) or out.device != x_device(node):
        return NotImplemented
    return TensorValue(tuple(out.shape), out.dtype, lambda i: cast(x(i), out.dtype))


def x_device(node) -> torch.device:
    return node.args[0].meta["val"].device


@register(aten.copy.default)
def copy(ctx, node, dst, src, non_blocking=False):
    out = node.meta["val"]
    s = expand(src, tuple(out.shape))
    return TensorValue(tuple(out.shape), out.dtype, lambda i: cast(s(i), out.dtype))


@register(aten.full.default, aten.scalar_tensor.default, aten.zeros.default, aten.ones.default)
def full(ctx, node, *args, **kw):
    out = node.meta["val"]
    if node.target is aten.full.default:
        v = args[1]
    elif node.target is aten.scalar_tensor.default:
        v = args[0]
    else:
        v = 0 if node.target is aten.zeros.default else 1
    c = const(v, out.dtype)
    return TensorValue(tuple(out.shape), out.dtype, lambda i: c)


@register(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default)
def full_like(ctx, node, x, *args, **kw):
    out = node.meta["val"]
    v = args[0] if node.target is aten.full_like.default else \
        (0 if node.target is aten.zeros_like.default else 1)
    c = const(v, out.dtype)
    return TensorValue(tuple(out.shape), out.dtype, lambda i: c)


@register(aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default)
def empty(ctx, node, *args, **kw):
    out = node.meta["val"]
    c = const(0, out.dtype)  # any value is valid for empty; zeros keep runs deterministic
    return TensorValue(tuple(out.shape), out.dtype, lambda i: c)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def arange(ctx, node, *args, **kw):
    out = node.meta["val"]
    if node.target is aten.arange.default:
        start, step = 0, 1
    else:
        start, step = args[0], (args[2] if len(args) > 2 else kw.get("step", 1))
    if out.dtype.is_floating_point:
        dt = opmath(out.dtype)
        return TensorValue(tuple(out.shape), out.dtype, lambda i: ir.op(
            "add", dt, const(start, dt), ir.op("mul", dt, cast(IndexValue(i[0]), dt),
                                               const(step, dt))))
    return TensorValue(tuple(out.shape), out.dtype, lambda i: cast(
        IndexValue(sympy.Integer(int(start)) + i[0] * int(step)), out.dtype))


@register(torch.ops.trainc.philox_uniform.default)
def philox_uniform(ctx, node, seed, offset, size, dtype, device):
    out = node.meta["val"]
    strides = ir.contiguous_strides(out.shape)

    def fn(i):
        counter = IndexValue(sympy.Integer(int(offset)) + ir.linear(i, strides))
        u = ir.op("philox_uniform", F32, cast(seed([]), torch.int64), counter)
        return cast(u, out.dtype)
    return TensorValue(tuple(out.shape), out.dtype, fn)
