"""The decomposition table trainc owns: ATen -> core ATen, minus ops codegen wants whole.

Kept whole: matmuls, convolutions and attention (extern kernels). Random ops become the
counter-based `trainc.philox_uniform` (see rng.py). Batch norm goes through its functional
form so running-stat updates show up as input mutations.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from trainc import rng

aten = torch.ops.aten

# Ops that map to library kernels (cuBLAS/oneDNN/cuDNN/flash attention): never decomposed.
EXTERN_OPS = (
    aten.mm, aten.addmm, aten.bmm, aten.baddbmm,
    aten.convolution, aten.convolution_backward,
    aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_cudnn_attention_backward,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
)

_EXTRA = (
    aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training,
)


def _overloads(packets) -> set:
    out = set()
    for p in packets:
        out.update(getattr(p, o) for o in p.overloads())
    return out


def _soft_margin_loss_backward(grad_output, self, target, reduction=1):
    """-y * g * sigmoid(-y * x): PyTorch's table writes y * g * (sigmoid(y * x) - 1), which
    cancels catastrophically once y * x is large (13% error at y * x = 15 in float32)."""
    low = self.dtype in (torch.float16, torch.bfloat16)
    x, y, g = (t.float() if low else t for t in (self, target, grad_output))
    out = -y * g * torch.sigmoid(-y * x)
    if reduction == 1:  # mean
        out = out / self.numel()
    return out.to(self.dtype)


def _log_softmax(x, dim, half_to_float=False):
    """x - max - log(sum(exp(x - max))) as graph nodes: the partitioner can then save the two
    row statistics and rebuild the result pointwise in the backward, instead of rereading each
    row twice (a 32000-word vocabulary's loss) to recompute them."""
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    xf = x.to(acc)
    shifted = xf - torch.amax(xf, dim, keepdim=True) if x.numel() else xf  # amax of nothing
    result = shifted - torch.log(torch.sum(torch.exp(shifted), dim, keepdim=True))
    return result if half_to_float else result.to(x.dtype)


def _cpu_std(default: Callable, kind: str) -> Callable:
    """var / var_mean / std / std_mean (`kind`) of a CPU float32 or 16-bit tensor from a
    float64 variance, rounded once: eager's CPU kernels (BatchNorm's statistics too)
    accumulate in double, so a row holding 1e30 has a finite std (4.5e29) where squaring in
    float32 overflows (findings/programs_cpp_0_0_3303), and values near 1e19 a finite, exact
    variance (3302, 3601). CUDA's kernel accumulates in float32: there the default stands
    (None: the op itself)."""
    def std(x, dim=None, *, correction=None, keepdim=False):
        if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float16,
                                                     torch.bfloat16):
            if default is None:
                return NotImplemented
            return default(x, dim, correction=correction, keepdim=keepdim)
        var, mean = torch.var_mean(x.double(), dim, correction=correction, keepdim=keepdim)
        if kind == "var":
            return var.to(x.dtype)
        if kind == "var_mean":
            return var.to(x.dtype), mean.to(x.dtype)
        out = torch.sqrt(var).to(x.dtype)
        return (out, mean.to(x.dtype)) if kind == "std_mean" else out
    return std


def build_table() -> dict[torch._ops.OpOverload, Callable]:
    table = {**core_aten_decompositions(), **get_decompositions(list(_EXTRA))}
    for op in _overloads(EXTERN_OPS):
        table.pop(op, None)
    table.update(rng.DECOMPOSITIONS)
    table[aten.soft_margin_loss_backward.default] = _soft_margin_loss_backward
    table[aten._log_softmax.default] = _log_softmax
    table[aten.std.correction] = _cpu_std(table[aten.std.correction], "std")
    table[aten.std_mean.correction] = _cpu_std(table[aten.std_mean.correction], "std_mean")
    table[aten.var.correction] = _cpu_std(table.get(aten.var.correction), "var")
    table[aten.var_mean.correction] = _cpu_std(table.get(aten.var_mean.correction), "var_mean")
    return table


TABLE = build_table()
