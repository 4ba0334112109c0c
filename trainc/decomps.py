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


def build_table() -> dict[torch._ops.OpOverload, Callable]:
    table = {**core_aten_decompositions(), **get_decompositions(list(_EXTRA))}
    for op in _overloads(EXTERN_OPS):
        table.pop(op, None)
    table.update(rng.DECOMPOSITIONS)
    table[aten.soft_margin_loss_backward.default] = _soft_margin_loss_backward
    table[aten._log_softmax.default] = _log_softmax
    return table


TABLE = build_table()
