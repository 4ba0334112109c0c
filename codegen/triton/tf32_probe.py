"""conv_channels_last="eager_tf32": does eager's own (NCHW) call of a float32 convolution run in
TF32 on this GPU? cuDNN picks its algorithm per shape: at some shapes eager's NCHW float32
convolutions are exact, at others cuDNN converts to NHWC and runs TF32 (H200 convnet: exact at
scale "cpu", TF32 at scale "gpu"). Channels-last convolutions run TF32 wherever TF32 is
allowed, so they meet DESIGN.md's accuracy rule (error within 2x eager's) only where eager
runs TF32 too. The probe runs the node's operator once with cuDNN TF32 disallowed and once
allowed, on the same random NCHW arguments: where every matrix product the node computes
differs at TF32's scale, eager runs TF32 there (`_differs_with_tf32`).
"""
from __future__ import annotations

import torch
import torch.fx as fx

_seen: dict[tuple, bool] = {}  # (operator, argument shapes and values) -> probed answer


def eager_runs_tf32(node: fx.Node) -> bool:
    """True when `node` (a convolution or convolution backward with float32 CUDA tensors)
    computes in TF32 when eager runs it in NCHW under the current cuDNN flags."""
    if not torch.backends.cudnn.allow_tf32:
        return False
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in node.args]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    if not tensors or any(t.dtype != torch.float32 or t.device.type != "cuda" for t in tensors):
        return False
    key = (node.target, tuple((tuple(v.shape), v.device) if isinstance(v, torch.Tensor)
                              else repr(v) for v in vals))
    if key not in _seen:
        try:
            _seen[key] = _differs_with_tf32(node.target, vals, tensors[0].device)
        except RuntimeError:  # out of memory (torch.OutOfMemoryError is one) or refused:
            return False  # NCHW, which is never less accurate than eager; probed next time
    return _seen[key]


def _differs_with_tf32(target, vals: list, device: torch.device) -> bool:
    """Every matrix-product result of the node (a forward's output; a backward's input and
    weight gradients, those its mask asks for) differs at TF32's scale with TF32 allowed. A
    backward whose input gradient cuDNN computes exactly while its weight gradient runs TF32
    (H200, scale "cpu") stays NCHW: channels-last would run both in TF32 and the inexact input
    gradient flows into every earlier layer's gradients. Differences below 1e-5 of the largest
    value are float32 algorithm choices, not TF32 (its 10-bit mantissa: ~3e-4 measured)."""
    gen = torch.Generator(device=device).manual_seed(0)
    args = [torch.randn(tuple(v.shape), dtype=v.dtype, device=device, generator=gen)
            if isinstance(v, torch.Tensor) else v for v in vals]
    results = []
    for tf32 in (False, True):
        with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled,
                                        benchmark=torch.backends.cudnn.benchmark,
                                        deterministic=torch.backends.cudnn.deterministic,
                                        allow_tf32=tf32):
            out = target(*args)
        products = out[:2] if isinstance(out, (tuple, list)) else (out,)  # not grad_bias
        results.append([t for t in products if isinstance(t, torch.Tensor)])
    return bool(results[0]) and all(_tf32_scale(a, b) for a, b in zip(*results))


def _tf32_scale(exact: torch.Tensor, tf32: torch.Tensor) -> bool:
    if exact.numel() == 0:
        return False
    scale = exact.abs().max()
    return bool((tf32 - exact).abs().max() > 1e-5 * scale) if scale > 0 else False
