"""A training step's predicted peak: the forward and backward wrappers' planned memory
(codegen/memory MemoryPlan) plus what lives outside them: the saved activations between the two,
the forward's other outputs where the caller holds them through the backward, and the gradients
as the backward makes them (its outputs: counted by its plan). Graph inputs (parameters, batch)
are allocated before the step and not counted, as a measured peak above the step's start does
not count them. `model(ids, labels=ids).loss.backward()` drops the outputs (logits) before the
backward: `outputs_held=False`, the default.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch.fx as fx

MiB = 2 ** 20


@dataclass(frozen=True)
class StepPeak:
    peak: int  # bytes above the step's start
    phase: str  # "forward" or "backward": where the peak is
    forward_peak: int  # the forward wrapper's planned peak
    backward_peak: int  # at the backward's worst event: the three parts below
    saved_held: int  # saved activations not yet freed by the backward at its worst event
    outputs_held: int  # the forward's outputs that are not saved, where the caller holds them
    backward_live: int  # the backward wrapper's planned live bytes there (gradients included)
    backward_top: tuple[tuple[str, int], ...] = ()  # its largest buffers live there
    outputs: int = 0  # the forward's outputs that are not saved, held or not

    def __str__(self) -> str:
        top = ", ".join(f"{n} {b / MiB:.1f}" for n, b in self.backward_top)
        return (f"predicted step peak {self.peak / MiB:.1f} MiB in the {self.phase}: forward "
                f"wrapper {self.forward_peak / MiB:.1f} MiB; backward "
                f"{self.backward_peak / MiB:.1f} MiB = saved activations held "
                f"{self.saved_held / MiB:.1f} + forward outputs held "
                f"{self.outputs_held / MiB:.1f} (of {self.outputs / MiB:.1f}) + backward "
                f"wrapper {self.backward_live / MiB:.1f}"
                + (f" (largest MiB: {top})" if top else ""))


def step_peak(fwd_plan, bwd_plan, bwd: fx.GraphModule, saved_storages: dict[str, str],
              storage_bytes: dict[str, int], outputs_held: bool = False) -> StepPeak:
    """`fwd_plan`, `bwd_plan`: the wrappers' MemoryPlans; `bwd`: the backward graph (its
    placeholders are the saved values, then tangents); `saved_storages`: saved activation name
    -> the storage it keeps alive (graph inputs left out); `storage_bytes`: bytes per storage;
    `outputs_held`: the caller keeps the forward's outputs through the backward."""
    fwd_end = fwd_plan.live_bytes[-1] if fwd_plan.events else 0
    saved_total = sum(storage_bytes[s] for s in set(saved_storages.values()))
    outputs = max(fwd_end - saved_total, 0)
    held_outputs = outputs if outputs_held else 0
    freed_at = _storage_frees(bwd_plan, bwd, saved_storages)
    best = (held_outputs + saved_total, -1, saved_total, 0)  # before the backward's first event
    frees: dict[int, int] = {}
    for s, i in freed_at.items():
        frees[i] = frees.get(i, 0) + storage_bytes[s]
    held = saved_total - frees.pop(-1, 0)  # saved values the backward never reads die at once
    for i, live in enumerate(bwd_plan.live_bytes):
        total = held_outputs + held + live
        if total > best[0]:
            best = (total, i, held, live)
        held -= frees.get(i, 0)
    total, at, saved_held, live = best
    top = tuple(sorted(bwd_plan.live_at(at).items(), key=lambda x: -x[1])[:4]) if at >= 0 else ()
    peak = max(fwd_plan.peak_bytes, total)
    return StepPeak(peak, "forward" if fwd_plan.peak_bytes >= total else "backward",
                    fwd_plan.peak_bytes, total, saved_held, held_outputs, live, top, outputs)


def _storage_frees(bwd_plan, bwd: fx.GraphModule, saved_storages: dict[str, str]) -> dict:
    """Per saved storage, the backward event after which its last reader's input is freed (a
    storage no input buffer frees is held to the end, as the runtime keeps it)."""
    tensors = [n.name for n in bwd.graph.nodes if n.op == "placeholder"
               and hasattr(n.meta.get("val"), "shape")]
    buffer_of = {b: name for (b, _), name in zip(bwd_plan.inputs, tensors)}
    end = len(bwd_plan.events)
    freed = {s: -1 for s in set(saved_storages.values())}
    for i, e in enumerate(bwd_plan.events):
        name = buffer_of.get(e.buf)
        if e.kind == "free" and name in saved_storages:
            s = saved_storages[name]
            freed[s] = max(freed[s], i)
    used = {saved_storages[n] for n in tensors if n in saved_storages}
    return {s: (i if i >= 0 else end) for s, i in freed.items() if s in used} | \
        {s: -1 for s in freed if s not in used}


def predict_step_peak(part, fwd, bwd, outputs_held: bool = False) -> Optional[StepPeak]:
    """The StepPeak of one compiled graph (partition.Partition and the forward and backward
    CompiledGraphs); None where a wrapper has no memory plan (the aten backend)."""
    fp = fwd.extra.get("memory_plan") if fwd is not None else None
    bp = bwd.extra.get("memory_plan") if bwd is not None else None
    if part is None or fp is None or bp is None:
        return None
    return plans_step_peak(part, fp, bp, outputs_held, part.offloaded)


def plans_step_peak(part, fwd_plan, bwd_plan, outputs_held: bool = False,
                    moved: Sequence[str] = ()) -> StepPeak:
    """The StepPeak of a Partition from its two graphs' MemoryPlans; `moved`: saved values in
    host memory between the two (the backward's plan counts them from their copy back)."""
    fp, bp = fwd_plan, bwd_plan
    held = [d for d in part.decisions if d.action == "saved" and not d.is_input and
            d.name not in set(moved)]
    storages = {d.name: d.storage or d.name for d in held}
    sizes = {d.storage or d.name: d.nbytes for d in held}
    return step_peak(fp, bp, part.bwd, storages, sizes, outputs_held)
