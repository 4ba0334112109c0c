"""GELU (exact or tanh-approximated) of a bfloat16/float16 value as a lookup in a table of its
65536 results (Config.triton_lookup_tables).

A 16-bit GELU's input is a 16-bit value (every lowered node's result is rounded to its dtype,
as eager rounds each op's output), so there are only 65536 inputs. The table holds eager's own
result for each, computed once at compile time by eager's kernel on the graph's device: the
lookup is eager's result bit for bit. The backward's table holds the float32 derivative
(cdf + x * pdf) that eager multiplies the incoming gradient by, computed by eager's float32
gelu_backward with a gradient of 1 (exact: 1 * d = d); the graph keeps the exact GELU's
backward whole for it (decomps.table_for). NaN results may carry another sign or payload than
eager's (eager's own CPU kernels differ there between their vector and scalar paths).

Why: libdevice's exact erf is ~29 of the 66 SASS instructions per element of normact's bf16
forward kernel (BENCHMARKS.md, session 18); the lookup is ~5 (41.5 per element in all).
"""
from __future__ import annotations

import torch

from trainc.codegen import ir
from trainc.codegen.ir import TensorValue
from trainc.codegen.lowerings import LOWERINGS
from trainc.codegen.lowerings.common import cast, opmath

aten = torch.ops.aten
CODE = {torch.bfloat16: "bf16_code", torch.float16: "f16_code"}
_tables: dict[tuple, torch.Tensor] = {}  # (what, approximate, dtype, device) -> table


def table(what: str, dtype: torch.dtype, device: torch.device,
          approximate: str = "none") -> torch.Tensor:
    """65536 values indexed by the 16-bit pattern of a `dtype` value: eager's gelu of it
    ("gelu", in `dtype`), or eager's float32 GELU derivative at it ("gelu_grad")."""
    key = (what, approximate, dtype, str(device))
    if key not in _tables:
        codes = torch.arange(1 << 16, dtype=torch.int32, device=device)
        x = (codes - ((codes >> 15) << 16)).to(torch.int16).view(dtype)  # pattern k at index k
        with torch.no_grad():
            if what == "gelu":
                t = torch.nn.functional.gelu(x, approximate=approximate)
            else:
                xf = x.float()
                t = aten.gelu_backward(torch.ones_like(xf), xf, approximate=approximate)
        _tables[key] = t.contiguous()
    return _tables[key]


def _lookup(tab: TensorValue, x: TensorValue, i) -> ir.Expr:
    code = ir.op(CODE[x.dtype], torch.int32, x(i))
    return tab([ir.indirect_symbol(cast(code, torch.int64), 1 << 16)])


def _device(node) -> torch.device:
    return node.meta["val"].device


def gelu(ctx, node, x, approximate="none"):
    out = node.meta["val"]
    if out.dtype not in CODE or x.dtype != out.dtype:
        return LOWERINGS[aten.gelu.default](ctx, node, x, approximate)
    tab = ctx.constant(table("gelu", out.dtype, _device(node), approximate))
    return TensorValue(tuple(out.shape), out.dtype, lambda i: _lookup(tab, x, i))


def gelu_backward(ctx, node, g, x, approximate="none"):
    out = node.meta["val"]
    if out.dtype not in CODE or x.dtype != out.dtype or \
            tuple(x.shape) != tuple(out.shape) or tuple(g.shape) != tuple(out.shape):
        return LOWERINGS[aten.gelu_backward.default](ctx, node, g, x, approximate)
    tab = ctx.constant(table("gelu_grad", out.dtype, _device(node), approximate))
    dt = opmath(out.dtype)
    return TensorValue(tuple(out.shape), out.dtype, lambda i: ir.op(
        "mul", dt, cast(g(i), dt), _lookup(tab, x, i)))


TABLE_LOWERINGS = {aten.gelu.default: gelu, aten.gelu_backward.default: gelu_backward}
