"""Hypothesis strategy `zoo_stacks()`: small CNN stacks built from the blocks zoo models use.

MobileNet/EfficientNet/ShuffleNet/DenseNet/ResNet are made of a handful of blocks: conv-BN-act
(ReLU6, Hardswish, SiLU), depthwise convolutions, inverted residuals, squeeze-excitation gates,
channel shuffles, dense concatenation, pooling, a pooled head with Dropout and Linear. Drawn in
train mode, BatchNorm often over tiny spatial maps (the end of a real network), optionally in
channels-last layout. Each stack is a modules.ModuleStack: it prints as a runnable module.
"""
from __future__ import annotations

from typing import Sequence

import hypothesis.strategies as st
import torch
from hypothesis import assume

from trainc.testing.modules import ModuleStack, _eager_ok
from trainc.testing.programs import DTYPES

ACTS = ("nn.ReLU()", "nn.ReLU6()", "nn.Hardswish()", "nn.SiLU()", "nn.GELU()")


def _conv_bn_act(draw, c_in: int, c_out: int, k: int, stride: int = 1, groups: int = 1) -> str:
    act = draw(st.sampled_from(ACTS))
    return (f"nn.Sequential(nn.Conv2d({c_in}, {c_out}, {k}, stride={stride}, padding={k // 2}, "
            f"groups={groups}, bias=False), nn.BatchNorm2d({c_out}), {act})")


@st.composite
def _block(draw, state: dict) -> tuple[str, str]:
    """One block for the current (channels, spatial size); updates `state`."""
    c, hw = state["c"], state["hw"]
    kind = draw(st.sampled_from(("conv_bn_act", "depthwise", "inverted_residual", "se",
                                 "shuffle", "dense", "pool", "bn", "act", "dropout")))
    if kind == "conv_bn_act":
        c2, k = draw(st.integers(1, 8)), draw(st.sampled_from((1, 3)))
        stride = 2 if hw >= 4 and draw(st.booleans()) else 1
        state.update(c=c2, hw=(hw + 2 * (k // 2) - k) // stride + 1)
        return _conv_bn_act(draw, c, c2, k, stride), "h = {m}(h)"
    if kind == "depthwise":
        return _conv_bn_act(draw, c, c, 3, 1, c), "h = {m}(h)"
    if kind == "inverted_residual":  # MobileNet-v2/EfficientNet: expand, depthwise, project
        e = c * draw(st.sampled_from((2, 4)))
        return (f"nn.Sequential({_conv_bn_act(draw, c, e, 1)}, {_conv_bn_act(draw, e, e, 3, 1, e)}, "
                f"nn.Conv2d({e}, {c}, 1, bias=False), nn.BatchNorm2d({c}))", "h = h + {m}(h)")
    if kind == "se":  # squeeze-excitation: a per-channel gate from the pooled map
        r = max(1, c // 2)
        gate = draw(st.sampled_from(("nn.Hardsigmoid()", "nn.Sigmoid()")))
        gate = "nn.Sigmoid()" if state["dtype"] == torch.float64 else gate  # FLOAT64_INEXACT
        return (f"nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d({c}, {r}, 1), nn.ReLU(), "
                f"nn.Conv2d({r}, {c}, 1), {gate})", "h = h * {m}(h)")
    if kind == "shuffle" and c % 2 == 0:  # ShuffleNet's channel shuffle between two groups
        return "nn.Identity()", "h = {m}(h.unflatten(1, (2, -1)).transpose(1, 2).flatten(1, 2))"
    if kind == "dense":  # DenseNet: BN-ReLU-conv, concatenated to its input
        g = draw(st.integers(1, 4))
        state["c"] = c + g
        return (f"nn.Sequential(nn.BatchNorm2d({c}), nn.ReLU(), nn.Conv2d({c}, {g}, 3, "
                "padding=1, bias=False))", "h = torch.cat([h, {m}(h)], 1)")
    if kind == "pool" and hw >= 2:
        ctor = draw(st.sampled_from(("nn.MaxPool2d(2)", "nn.AvgPool2d(2)",
                                     "nn.MaxPool2d(3, stride=2, padding=1)")))
        state["hw"] = hw // 2 if "padding" not in ctor else (hw - 1) // 2 + 1
        return ctor, "h = {m}(h)"
    if kind == "bn":
        return f"nn.BatchNorm2d({c})", "h = {m}(h)"
    if kind == "dropout":
        return f"nn.Dropout({draw(st.sampled_from((0.1, 0.2, 0.5)))})", "h = {m}(h)\n        d{i} = h"
    return draw(st.sampled_from(ACTS)), "h = {m}(h)"


@st.composite
def _head(draw, c: int) -> list[tuple[str, str]]:
    """Pool to a vector, then Dropout / Linear / LayerNorm / activations (a classifier)."""
    layers = [("nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())", "h = {m}(h)")]
    f = c
    for kind in draw(st.lists(st.sampled_from(("linear", "ln", "act", "dropout", "residual")),
                              max_size=3)):
        if kind == "linear":
            out = draw(st.integers(1, 10))
            layers.append((f"nn.Linear({f}, {out})", "h = {m}(h)"))
            f = out
        elif kind == "ln":
            layers.append((f"nn.LayerNorm({f})", "h = {m}(h)"))
        elif kind == "dropout":
            layers.append(("nn.Dropout(0.2)", "h = {m}(h)\n        d{i} = h"))
        elif kind == "residual":
            layers.append((f"nn.Linear({f}, {f})", "h = h + {m}(h)"))
        else:
            layers.append((draw(st.sampled_from(ACTS)), "h = {m}(h)"))
    return layers


@st.composite
def zoo_stacks(draw, dtypes: Sequence[torch.dtype] = DTYPES, max_blocks: int = 5) -> ModuleStack:
    """Random CNN stacks over (N, C, H, W) images, N 2-4, H = W in 1..8, train mode."""
    dtype = draw(st.sampled_from(tuple(dtypes)))
    n, c, hw = draw(st.integers(2, 4)), draw(st.integers(1, 6)), draw(st.sampled_from(
        (4, 1, 2, 3, 5, 7, 8)))
    state = {"c": c, "hw": hw, "dtype": dtype}
    layers = [draw(_block(state)) for _ in range(draw(st.integers(1, max_blocks)))]
    if draw(st.booleans()):
        layers += draw(_head(state["c"]))
    layers = [(ctor, line.replace("{i}", str(i))) for i, (ctor, line) in enumerate(layers)]
    stack = ModuleStack(dtype, tuple(layers), (n, c, hw, hw), 0, draw(st.booleans()),
                        draw(st.integers(0, 2**16)), channels_last=draw(st.booleans()))
    assume(_eager_ok(stack))
    return stack
