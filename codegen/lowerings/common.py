"""Helpers shared by lowerings: broadcasting, casts, scalar values, pointwise construction.

Expr dtypes are compute dtypes: bfloat16/float16 math runs in float32 ("opmath"), and a cast
to a low-precision dtype rounds; TensorValue dtypes are the logical (stored) dtypes.
"""
from __future__ import annotations

from typing import Callable, Sequence, Union

import sympy
import torch
import torch.fx as fx

from trainc.codegen import ir
from trainc.codegen.ir import Const, Expr, TensorValue

LOW = (torch.bfloat16, torch.float16)
Scalar = Union[int, float, bool]


def opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in LOW else dtype


def cast(e: Expr, dtype: torch.dtype) -> Expr:
    """Value conversion; widening bf16 -> float32 is free, narrowing rounds."""
    if e.dtype == dtype or (e.dtype in LOW and dtype == torch.float32):
        return e
    if isinstance(e, Const):
        return Const(_py(e.value, dtype), dtype if dtype not in LOW else torch.float32)
    return ir.op("cast", dtype, e)


def _py(v: Scalar, dtype: torch.dtype) -> Scalar:
    if dtype == torch.bool:
        return bool(v)
    if dtype.is_floating_point:
        return float(v)
    return int(v)


def const(v: Scalar, dtype: torch.dtype) -> Const:
    return Const(_py(v, dtype), opmath(dtype))


def as_value(x, dtype: torch.dtype) -> TensorValue:
    """Tensors pass through; Python scalars become 0-d constants of `dtype`."""
    if isinstance(x, TensorValue):
        return x
    c = const(x, dtype)
    return TensorValue((), dtype, lambda idx: c)


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))


def expand(v: TensorValue, shape: Sequence[int]) -> TensorValue:
    """Broadcast v to `shape` (trailing alignment, size-1 dims read index 0)."""
    shape = tuple(int(s) for s in shape)
    if v.shape == shape:
        return v
    lead = len(shape) - len(v.shape)

    def fn(idx):
        return v([sympy.Integer(0) if s == 1 and shape[lead + i] != 1 else idx[lead + i]
                  for i, s in enumerate(v.shape)])
    stride = None
    if v.view is not None:
        stride = [0] * lead + [0 if s == 1 and shape[lead + i] != 1 else v.view.stride[i]
                               for i, s in enumerate(v.shape)]
    return ir.strided_view(v, shape, stride or [], 0, fn) if stride is not None else \
        TensorValue(shape, v.dtype, fn)


def pointwise(node: fx.Node, f: Callable[..., Expr], *inputs, compute=None) -> TensorValue:
    """out[i] = f(*inputs[i]) with broadcasting; operands cast to the compute dtype."""
    out = node.meta["val"]
    compute = compute or opmath(out.dtype)
    vals = [as_value(x, compute) for x in inputs]
    shape = tuple(out.shape)
    vals = [expand(v, shape) for v in vals]

    def fn(idx):
        return f(*[cast(v(idx), compute) for v in vals])
    return TensorValue(shape, out.dtype, fn)


def promoted(node: fx.Node, *positions: int) -> torch.dtype:
    """ATen type promotion over the node's arguments at `positions` (FakeTensors, scalars)."""
    vals = [fake(node, i) for i in positions if i < len(node.args)]
    out = vals[0]
    for v in vals[1:]:
        out = _probe(torch.result_type(out, v), out, v)
    return out.dtype if isinstance(out, torch.Tensor) else torch.result_type(torch.tensor(out), out)


def _probe(dtype, a, b):
    dims = max((x.dim() for x in (a, b) if isinstance(x, torch.Tensor)), default=0)
    return torch.empty((1,) * dims, dtype=dtype)


def fake(node: fx.Node, i: int):
    """The FakeTensor (or Python value) of positional argument i."""
    a = node.args[i]
    return a.meta["val"] if isinstance(a, fx.Node) else a


def norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
