"""Hypothesis strategy `module_stacks()`: random nn.Module stacks of the layers training uses.

A ModuleStack prints as a runnable module (class Model + make_model + make_inputs): Linear,
LayerNorm, BatchNorm, Conv2d, Embedding, GELU/SiLU/ReLU, Dropout and residual adds.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import hypothesis.strategies as st
import torch
import torch.nn as nn
from hypothesis import assume

from trainc.testing.programs import DTYPES, replay_dropout

ACTIVATIONS = ("nn.GELU()", "nn.SiLU()", "nn.ReLU()")


@dataclass(frozen=True)
class ModuleStack:
    dtype: torch.dtype
    layers: tuple[tuple[str, str], ...]  # (constructor source, forward line using `{m}`)
    input_shape: tuple[int, ...]
    tokens: int = 0  # > 0: the input is int64 token ids below this (an Embedding comes first)
    requires_grad: bool = True
    seed: int = 0
    channels_last: bool = False  # model and (4-d) input in channels-last memory format

    @property
    def source(self) -> str:
        init = [f"        self.m{i} = {ctor}" for i, (ctor, _) in enumerate(self.layers)]
        fwd = [f"        {line.format(m=f'self.m{i}')}" for i, (_, line) in enumerate(self.layers)]
        drops = [f"d{i}" for i, (ctor, _) in enumerate(self.layers) if ctor.startswith("nn.Drop")]
        return "\n".join([
            "import torch", "import torch.nn as nn", "", "",
            "class Model(nn.Module):", "    def __init__(self):", "        super().__init__()",
            *init, "", "    def forward(self, h):", *fwd,
            f"        return ({', '.join(['h'] + drops)},)", "", "",
            f"def make_model(dtype={self.dtype}):", f"    torch.manual_seed({self.seed})",
            "    model = Model()",
            "    for m in model.modules():  # norms start as identity; make their grads visible",
            "        if isinstance(m, (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d)):",
            "            nn.init.normal_(m.weight)",
            "            nn.init.normal_(m.bias)",
            "    return model.to(dtype)" + (".to(memory_format=torch.channels_last)"
                                           if self.channels_last else ""), "", "",
            f"def make_inputs(dtype={self.dtype}):",
            f"    g = torch.Generator().manual_seed({self.seed})",
            "    " + self._input_line(), "    return [x]", ""])

    def _input_line(self) -> str:
        if self.tokens:
            return f"x = torch.randint(0, {self.tokens}, {self.input_shape}, generator=g)"
        grad = ".requires_grad_()" if self.requires_grad else ""
        layout = ".contiguous(memory_format=torch.channels_last)" \
            if self.channels_last and len(self.input_shape) == 4 else ""
        return (f"x = torch.randn({self.input_shape}, generator=g, dtype=torch.float64)"
                f".to(dtype){layout}{grad}")

    def __repr__(self) -> str:
        return "\n" + self.source

    def _repr_pretty_(self, p, cycle) -> None:  # hypothesis prints falsifying examples so
        p.text(repr(self))

    def _namespace(self) -> dict:
        ns: dict = {}
        exec(compile(self.source, "<trainc module stack>", "exec"), ns)
        return ns

    def make_model(self, dtype: Optional[torch.dtype] = None) -> nn.Module:
        return self._namespace()["make_model"](dtype or self.dtype)

    def make_inputs(self, dtype: Optional[torch.dtype] = None) -> list:
        return self._namespace()["make_inputs"](dtype or self.dtype)

    def reference(self, model: nn.Module) -> Callable[[Sequence], nn.Module]:
        return replay_dropouts(model)

    def check(self, **compile_options) -> list:
        from trainc.testing.check import assert_grads_match
        model = self.make_model()
        return assert_grads_match(model, self.make_inputs, reference=self.reference(model),
                                  source=self.source, **compile_options)


def replay_dropouts(model: nn.Module) -> Callable[[Sequence], nn.Module]:
    """compiled outputs -> a copy of `model` whose Dropouts replay the compiled masks (the
    stack's last outputs, one per Dropout)."""
    def make(compiled_outputs: Sequence) -> nn.Module:
        import copy
        drops = [n for n, m in model.named_modules() if isinstance(m, nn.Dropout)]
        recorded = list(compiled_outputs[len(compiled_outputs) - len(drops):])
        ref = copy.deepcopy(model)
        for name, y in zip(drops, recorded):
            setattr(ref, name, ReplayDropout(ref.get_submodule(name).p, y, name))
        return ref
    return make


class ReplayDropout(nn.Module):
    """Dropout whose mask is (recorded output != 0): see programs.ReplayFunctional. An input
    that is 0 where the output is 0 hides the mask (kept or dropped give the same output but
    not the same gradient): UnreplayableDropout, not a guess. A bf16 stack can make an exact 0
    before a Dropout (finding modules_cpp_0_5_20261421: one of 300 values)."""

    def __init__(self, p: float, recorded: torch.Tensor, name: str = "dropout"):
        super().__init__()
        self.p, self.recorded, self.name = p, recorded, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == 0:  # as F.dropout: an empty input is returned itself
            return x
        return replay_dropout(x, self.recorded, self.p, self.name)


@st.composite
def _layer(draw, state: dict) -> Optional[tuple[str, str]]:
    """One layer for the current activation shape (state: rank, features, image?), or None."""
    kind = draw(st.sampled_from(("linear", "norm", "act", "dropout", "residual", "conv",
                                 "flatten")))
    f = state["features"]
    if kind == "act":
        return draw(st.sampled_from(ACTIVATIONS)), "h = {m}(h)"
    if kind == "dropout":
        return f"nn.Dropout({draw(st.sampled_from((0.1, 0.5)))})", "h = {m}(h)\n        d{i} = h"
    if state["image"]:
        if kind == "norm":
            return f"nn.BatchNorm2d({f})", "h = {m}(h)"
        if kind == "residual":
            return f"nn.Conv2d({f}, {f}, 3, padding=1)", "h = h + {m}(h)"
        if kind == "flatten":
            state.update(image=False, rank=2, features=f * state["hw"] ** 2)
            return "nn.Flatten()", "h = {m}(h)"
        c, k = draw(st.integers(1, 6)), draw(st.sampled_from((1, 3)))
        stride = draw(st.sampled_from((1, 2))) if state["hw"] >= 4 else 1
        pad = k // 2
        state.update(features=c, hw=(state["hw"] + 2 * pad - k) // stride + 1)
        return f"nn.Conv2d({f}, {c}, {k}, stride={stride}, padding={pad})", "h = {m}(h)"
    if kind == "norm":
        if state["rank"] == 2 and draw(st.booleans()):
            return f"nn.BatchNorm1d({f})", "h = {m}(h)"
        return f"nn.LayerNorm({f})", "h = {m}(h)"
    if kind == "residual":
        return f"nn.Linear({f}, {f})", "h = h + {m}(h)"
    out = draw(st.integers(1, 12))
    state["features"] = out
    return f"nn.Linear({f}, {out}, bias={draw(st.booleans())})", "h = {m}(h)"


@st.composite
def module_stacks(draw, dtypes: Sequence[torch.dtype] = DTYPES, max_layers: int = 8) -> ModuleStack:
    """Random stacks: token ids -> Embedding, (N, C, H, W) images, or (N, [T,] D) features."""
    dtype = draw(st.sampled_from(tuple(dtypes)))
    start = draw(st.sampled_from(("features", "image", "tokens")))
    n = draw(st.integers(2, 4))
    layers: list[tuple[str, str]] = []
    tokens = 0
    if start == "image":
        c, hw = draw(st.integers(1, 4)), draw(st.integers(1, 6))
        shape, state = (n, c, hw, hw), {"image": True, "rank": 4, "features": c, "hw": hw}
    else:
        d = draw(st.integers(1, 12))
        shape = (n,) if start == "tokens" else (n, d)
        if draw(st.booleans()):
            shape += (draw(st.integers(1, 4)),) if start == "tokens" else ()
            shape = shape if start == "tokens" else (n, draw(st.integers(1, 4)), d)
        state = {"image": False, "rank": len(shape) + (start == "tokens"), "features": d}
        if start == "tokens":
            tokens = draw(st.integers(1, 10))
            layers.append((f"nn.Embedding({tokens}, {d})", "h = {m}(h)"))
    for _ in range(draw(st.integers(1, max_layers))):
        layer = draw(_layer(state))
        if layer is not None:
            layers.append(layer)
    layers = [(ctor, line.replace("{i}", str(i))) for i, (ctor, line) in enumerate(layers)]
    stack = ModuleStack(dtype, tuple(layers), shape, tokens, draw(st.booleans()),
                        draw(st.integers(0, 2**16)))
    assume(_eager_ok(stack))
    return stack


def _eager_ok(stack: ModuleStack) -> bool:
    """Eager must run forward and backward (e.g. BatchNorm wants > 1 value per channel)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs = stack.make_model()(*stack.make_inputs())
            outs[0].sum().backward()
        return True
    except (RuntimeError, ValueError):
        return False
