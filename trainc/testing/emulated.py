"""Emulated low-precision evaluations: float64 runs with every op's result rounded to a lower
dtype, after a nudge under one unit roundoff that differs per draw. Their largest error against
the float64 result is how far a valid evaluation in that dtype may land (a ReLU input within
rounding of 0 goes either way); the policy uses it as eager's error when larger (check.py)."""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from trainc.testing.policy import rel_err

DRAWS = 5


def spread(evaluate: Callable[[TorchDispatchMode], dict], dtype: torch.dtype, refs: dict,
           draws: int = DRAWS) -> dict[str, float]:
    """The largest error of `draws` emulated evaluations per value. `evaluate(mode)` runs the
    program once in float64 with `mode` entered around the computation only (its inputs made
    outside: exact in every run) and returns {what: value}; `refs` holds the float64 values.
    No linearity test: these are evaluations eager could have made. {} when a draw raises."""
    errs: dict[str, list[float]] = {}
    for draw in range(draws):
        try:
            vals = evaluate(RoundToDtype(dtype, draw))
        except Exception:  # noqa: BLE001 - e.g. a rounded value out of an op's domain
            return {}
        for what, v in vals.items():
            r = refs.get(what)
            if torch.is_tensor(v) and torch.is_tensor(r) and v.is_floating_point() \
                    and v.shape == r.shape:
                mask = torch.isfinite(v) & torch.isfinite(r)
                if bool(mask.any()):
                    errs.setdefault(what, []).append(rel_err(v, r, mask))
    return {what: max(e) for what, e in errs.items() if len(e) == draws}


class RoundToDtype(TorchDispatchMode):
    """Rounds every float64 result of a functional ATen op to `dtype` (and back), after a
    relative nudge below half its eps (draw 0: no nudge) where the result is not exact in
    `dtype`. The nudge is a function of the element's value and the draw (value_noise)."""

    def __init__(self, dtype: torch.dtype, draw: int):
        super().__init__()
        self.dtype, self.draw = dtype, draw

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not rounds(func, args):
            return out

        def rnd(t):
            if not (torch.is_tensor(t) and t.dtype == torch.float64 and t.numel()
                    and t.layout == torch.strided):
                return t
            rounded = t.to(self.dtype).to(torch.float64)
            if not self.draw:
                return rounded
            # A result exact in `dtype` stays exact: a faithfully rounded op returns it (so
            # ties eager keeps, maximum(x, x.mean()) of equal values, are kept here too).
            noise = value_noise(t, self.draw)
            nudged = (t * (1 + noise * torch.finfo(self.dtype).eps))
            return torch.where(rounded == t, t, nudged.to(self.dtype).to(torch.float64))
        return tree_map(rnd, out)


def value_noise(t: torch.Tensor, draw: int) -> torch.Tensor:
    """Uniform in [-0.5, 0.5) per element, a hash of its float64 bits and `draw`: equal values
    get equal noise, as an op gives equal results for equal exact values in any evaluation.
    Noise drawn per element rounded copies of one value apart (sin of an expanded input): their
    std, exactly 0, became rounding noise and its gradient 0/0 (policy review, BENCHMARKS.md
    session 27: a float32 gradient's "valid spread" 0.49, where eager and trainc were 4e-8)."""
    h = t.contiguous().view(torch.int64) + draw * 0x9E3779B97F4A7C1
    for _ in range(2):  # multiply-xorshift rounds (int64 arithmetic wraps)
        h = h * 0x5851F42D4C957F2D
        h = h ^ (h >> 29)
    return ((h >> 11) & 0xFFFFFF).to(torch.float64) / 2.0 ** 24 - 0.5


def rounds(func, args) -> bool:
    """Whether a low-precision run rounds this op's result: not views or in-place ops (their
    results alias inputs), not dtype conversions (exact here: the run's inputs, parameters and
    tangents cast to float64) and not factories (the tangents' draw): only computed values."""
    schema = func._schema
    if schema.is_mutable or any(r.alias_info for r in schema.returns):
        return False
    if func is torch.ops.aten._to_copy.default:
        return False
    return any(torch.is_tensor(a) for a in tree_flatten(list(args))[0])
