"""Boundary flips: inputs of a clamp, ReLU or max that sit within rounding of the cutoff.

Eager's own intermediate (same dtype) and float64's are recorded at every cutoff op; an element
whose float64 distance to the cutoff is within NEAR_MARGIN times eager's rounding of that input
may land on either side in any valid evaluation. `flipped_references` re-runs float64 with
subsets of those elements mirrored across the cutoff (only in the run's data, so the op and its
backward see the same side): each run is the float64 answer of an evaluation that rounded them
the other way. A compiled value is excused only when it matches one of these (see second.py)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
NEAR_MARGIN = 4.0  # another evaluation order may carry a few times eager's rounding
ENUMERATE_UP_TO = 4  # near elements: every subset up to this many, sampled subsets beyond
SAMPLED_SUBSETS = 8
MAX_NEAR = 64  # more than this: not a boundary case but a flat region; no opinion


def _scalar_cutoffs(*values) -> Callable:
    return lambda args: [float(v) for v in values]


def _hardtanh(args) -> list[float]:
    lo = args[1] if len(args) > 1 else -1.0
    hi = args[2] if len(args) > 2 else 1.0
    return [float(lo), float(hi)]


def _clamp(args) -> list[float]:
    return [float(v) for v in args[1:3] if isinstance(v, (int, float))]


def _second_scalar(args) -> list[float]:
    return [float(args[1])] if len(args) > 1 and isinstance(args[1], (int, float)) else []


# forward ops whose derivative jumps where input 0 crosses these values (the backward ops read
# the forward's input or output, so mirroring the input flips both)
CUTOFFS: dict = {
    aten.relu.default: _scalar_cutoffs(0.0), aten.relu_.default: _scalar_cutoffs(0.0),
    aten.leaky_relu.default: _scalar_cutoffs(0.0), aten.abs.default: _scalar_cutoffs(0.0),
    aten.hardtanh.default: _hardtanh, aten.hardtanh_.default: _hardtanh,
    aten.hardswish.default: _scalar_cutoffs(-3.0, 3.0),
    aten.hardsigmoid.default: _scalar_cutoffs(-3.0, 3.0),
    aten.clamp.default: _clamp, aten.clamp_min.default: _second_scalar,
    aten.clamp_max.default: _second_scalar, aten.threshold.default: _second_scalar,
    aten.lt.Scalar: _second_scalar, aten.le.Scalar: _second_scalar,
    aten.gt.Scalar: _second_scalar, aten.ge.Scalar: _second_scalar,
}
PAIRS = (aten.maximum.default, aten.minimum.default)  # the cutoff is the other operand


@dataclass(frozen=True)
class NearCutoff:
    """Elements of one cutoff op's input within rounding of the cutoff."""
    call: int  # index among the run's cutoff-op calls
    op: str
    flat: tuple[int, ...]  # flat element indices
    distance: float  # the smallest float64 distance to the cutoff among them
    rounding: float  # eager's largest absolute error of that input

    def __str__(self) -> str:
        return (f"{len(self.flat)} input(s) of {self.op} {self.distance:.2g} from the cutoff "
                f"(eager's rounding there {self.rounding:.2g})")


class _Record(TorchDispatchMode):
    """Records (op, input, cutoff tensor) at every cutoff-op call, before it runs."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        cut = _cutoff_of(func, args)
        if cut is not None:
            self.calls.append((str(func), args[0].detach().clone(), cut))
        return func(*args, **(kwargs or {}))


def _cutoff_of(func, args) -> Optional[torch.Tensor]:
    """The nearest cutoff per element of args[0] (float64), or None for other ops. Forward
    calls only (grad mode on): backward formulas call comparisons too (clamp's ge/le) on the
    forward's input, which the forward's flip already moved."""
    x = args[0] if args else None
    if not torch.is_grad_enabled():
        return None
    if not (torch.is_tensor(x) and x.is_floating_point() and x.numel()):
        return None
    if func in PAIRS:
        other = args[1]
        if not (torch.is_tensor(other) and other.shape == x.shape):
            return None
        return other.detach().double().clone()
    rule = CUTOFFS.get(func)
    values = rule(args) if rule is not None else []
    if not values:
        return None
    xd = x.detach().double()
    cands = torch.stack([torch.full_like(xd, v) for v in values])
    pick = (xd.unsqueeze(0) - cands).abs().argmin(0, keepdim=True)
    return cands.gather(0, pick).squeeze(0)


def near_cutoffs(low: list, ref: list) -> list[NearCutoff]:
    """Matches the same-dtype and float64 recordings call by call (a run whose cutoff calls
    differ gives no opinion: [])."""
    if len(low) != len(ref):
        return []
    out = []
    for i, ((op_l, x_l, _), (op_r, x_r, c_r)) in enumerate(zip(low, ref)):
        if op_l != op_r or x_l.shape != x_r.shape:
            return []
        diff = x_l.double() - x_r
        finite = torch.isfinite(diff)
        if not bool(finite.any()):
            continue
        rounding = diff[finite].abs().max().item()
        dist = (x_r - c_r).abs()
        # exactly at the cutoff: mirroring moves nothing (relu of relu's zeros), not a case
        near = finite & (dist > 0) & (dist <= NEAR_MARGIN * rounding) if rounding > 0 else None
        if near is None or not bool(near.any()):
            continue
        flat = tuple(int(k) for k in near.reshape(-1).nonzero().reshape(-1))
        out.append(NearCutoff(i, op_r, flat, dist.reshape(-1)[list(flat)].min().item(),
                              rounding))
    return out


class _Flip(TorchDispatchMode):
    """Mirrors the chosen elements of each cutoff op's input across its nearest cutoff, in the
    tensor's data (no version bump: autograd's saved copy is the same storage, so the op's
    backward sees the flipped side too)."""

    def __init__(self, chosen: dict[int, list[int]]):
        super().__init__()
        self.chosen, self.calls = chosen, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        cut = _cutoff_of(func, args)
        if cut is not None:
            flat = self.chosen.get(self.calls)
            self.calls += 1
            if flat:
                x = args[0]
                idx = torch.unravel_index(torch.tensor(flat), x.shape)
                with torch.no_grad():
                    x.data[idx] = (2 * cut[idx] - x.data[idx].double()).to(x.dtype)
        return func(*args, **(kwargs or {}))


def subsets(near: list[NearCutoff], seed: int = 0) -> list[dict[int, list[int]]]:
    """The flip patterns to try: every non-empty subset of a few near elements; else each
    element alone, all of them, and random halves."""
    elems = [(n.call, k) for n in near for k in n.flat]
    if not elems or len(elems) > MAX_NEAR:
        return []
    if len(elems) <= ENUMERATE_UP_TO:
        picks = [c for r in range(1, len(elems) + 1) for c in itertools.combinations(elems, r)]
    else:
        g = torch.Generator().manual_seed(seed)
        picks = [(e,) for e in elems] + [tuple(elems)]
        for _ in range(SAMPLED_SUBSETS):
            keep = torch.rand(len(elems), generator=g) < 0.5
            picks.append(tuple(e for e, k in zip(elems, keep.tolist()) if k))
    out = []
    for pick in picks:
        chosen: dict[int, list[int]] = {}
        for call, k in pick:
            chosen.setdefault(call, []).append(k)
        out.append(chosen)
    return out


def recorded(run: Callable[[], object]) -> list:
    """The cutoff-op calls of one run."""
    with _Record() as rec:
        run()
    return rec.calls


def flipped(run: Callable[[], object], chosen: dict[int, list[int]]):
    with _Flip(chosen):
        return run()
