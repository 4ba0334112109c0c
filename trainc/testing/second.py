"""Second opinions on values the policy failed, asked only after a failure (they cost runs).

1. Eager variants: the same function eagerly in another valid evaluation (channels-last
   layout, one thread: other reduction orders). Their largest error counts as eager's.
2. Boundary flips (flips.py): where inputs of a clamp/ReLU/max sit within rounding of the
   cutoff, float64 runs with subsets of them flipped are alternative references. The failed
   values are excused only when one such reference explains all of them at once under the
   policy (the compiled run flipped those elements); a wrong kernel near a cutoff still fails.
Excused values come back as notes (Mismatch with kind "eager variant" or "boundary flip").
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Protocol

import torch

from trainc.testing import flips
from trainc.testing.policy import ALL_ON, Mismatch, Relaxations, compare

Values = dict  # what -> value, as check._values names them


class Runs(Protocol):
    """The runs a second opinion needs; check.py provides them."""
    def values(self, run) -> Values: ...
    def variants(self) -> list[str]: ...
    def eager_variant(self, name: str) -> Values: ...
    def record(self, low_precision: bool) -> list: ...
    def flipped_reference(self, chosen: dict) -> Values: ...


def reconsider(failed: list[Mismatch], comp: Values, eager: Values, ref: Values,
               cond: dict, runs: Runs, relax: Relaxations = ALL_ON
               ) -> tuple[list[Mismatch], list[Mismatch]]:
    """(still failing, excused notes). `relax` says whether eager variants and boundary
    flips may excuse a value (and which of policy's relaxations the re-checks apply)."""
    numeric = [m for m in failed if m.err_compiled is not None]
    if not numeric or not (relax.eager_variants or relax.boundary_flips):
        return failed, []
    spread, which = {}, {}
    if relax.eager_variants:
        spread, which = _variant_spread([m.what for m in numeric], ref, runs)
    still, notes = [], []
    for m in numeric:
        if m.what not in spread:
            still.append(m)
            continue
        hint = max(cond.get(m.what, 0.0), spread[m.what]) or None
        again = compare(m.what, comp[m.what], eager[m.what], ref[m.what], eager_err=hint,
                        relax=relax)
        if again is None:
            notes.append(replace(m, kind="eager variant",
                                 reason=f"within the spread of eager variants ({which[m.what]}: "
                                        f"err {spread[m.what]:.3g})"))
        else:
            still.append(again)
    if still and relax.boundary_flips:
        still, flip_notes = _boundary_flips(still, comp, eager, ref, cond, spread, runs, relax)
        notes += flip_notes
    others = [m for m in failed if m.err_compiled is None]
    return others + still, notes


def _variant_spread(whats: list[str], ref: Values, runs: Runs) -> tuple[dict, dict]:
    spread: dict[str, float] = {}
    which: dict[str, str] = {}
    for name in runs.variants():
        try:
            vals = runs.eager_variant(name)
        except Exception:  # noqa: BLE001 - a variant eager cannot run gives no opinion
            continue
        for what in whats:
            err = _err(vals.get(what), ref.get(what))
            if err is not None and err > spread.get(what, 0.0):
                spread[what], which[what] = err, name
    return spread, which


def _boundary_flips(failed: list[Mismatch], comp: Values, eager: Values, ref: Values,
                    cond: dict, spread: dict, runs: Runs, relax: Relaxations = ALL_ON):
    try:
        near = flips.near_cutoffs(runs.record(True), runs.record(False))
    except Exception:  # noqa: BLE001 - no recording, no opinion
        return failed, []
    for chosen in flips.subsets(near):
        try:
            alt = runs.flipped_reference(chosen)
        except Exception:  # noqa: BLE001
            continue
        if all(_passes(m.what, comp, eager, ref, alt, cond, spread, relax) for m in failed):
            where = "; ".join(str(n) for n in near if n.call in chosen)
            flipped_n = sum(len(v) for v in chosen.values())
            return [], [replace(m, kind="boundary flip",
                                reason=f"matches float64 with {flipped_n} near-cutoff "
                                       f"element(s) on the other side: {where}")
                        for m in failed]
    if near:
        failed = [replace(m, reason=m.reason + f"; {sum(len(n.flat) for n in near)} input(s) "
                          "near a cutoff, no flip of them explains it") for m in failed]
    return failed, []


def _passes(what: str, comp: Values, eager: Values, ref: Values, alt: Values, cond: dict,
            spread: dict, relax: Relaxations = ALL_ON) -> bool:
    """The compiled value against an alternative reference `alt`, with eager's own rounding
    error (eager - ref) moved onto it: eager did not flip, so its error against `alt` would
    include the flip itself and excuse anything."""
    a, e, r = alt.get(what), eager[what], ref[what]
    if not (torch.is_tensor(a) and torch.is_tensor(e) and a.shape == e.shape):
        return False
    like = (a.double() + (e.double() - r.double())).to(e.dtype)
    hint = max(cond.get(what, 0.0), spread.get(what, 0.0)) or None
    return compare(what, comp[what], like, a, eager_err=hint, relax=relax) is None


def _err(x, ref) -> Optional[float]:
    if not (torch.is_tensor(x) and torch.is_tensor(ref) and x.shape == ref.shape
            and x.is_floating_point()):
        return None
    mask = torch.isfinite(x) & torch.isfinite(ref)
    if not bool(mask.any()):
        return None
    diff = torch.linalg.vector_norm(x.double()[mask] - ref.double()[mask]).item()
    scale = torch.linalg.vector_norm(ref.double()[mask]).item()
    return diff / scale if scale > 0 else diff

