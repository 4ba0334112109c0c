"""Graph passes, one per file (file name = function name), and the ordered lists the driver runs.

Every pass maps GraphModule -> GraphModule; `run_passes` times each one, dumps the graph after
it when a debug directory is set, and records allocation counts before/after in gm.meta.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch.fx as fx

from trainc.graph import GraphSignature
from trainc.passes._graph import DEFER_RECOMPILE, allocation_stats
from trainc.passes.as_strided_views import as_strided_views
from trainc.passes.check_mutations import MutationError, check_mutations
from trainc.passes.eliminate_common_subexpressions import eliminate_common_subexpressions
from trainc.passes.fold_constants import fold_constants
from trainc.passes.one_hot_scatters import one_hot_scatters
from trainc.passes.pad_matmuls import pad_matmuls
from trainc.passes.reinplace_ops import MUTABLE_INPUTS, REINPLACED, reinplace_ops
from trainc.passes.remove_aliases import remove_aliases
from trainc.passes.remove_dead_code import remove_dead_code
from trainc.passes.remove_noops import remove_noops
from trainc.passes.rewrite_patterns import RULES, Rewrite, register_rewrite, rewrite_patterns
from trainc.passes.zero_tangents import ZERO_FOLDS, ZERO_RULES, fold_zero_tangents

Pass = Callable[[fx.GraphModule], fx.GraphModule]
STATS = "trainc.pass_stats"  # gm.meta key: PassStats of the last run_passes on that graph

# Run on the joint graph, before the partition. The graph stays functional.
JOINT_PASSES: list[Pass] = [remove_aliases, as_strided_views, remove_noops, fold_constants,
                            one_hot_scatters, rewrite_patterns, eliminate_common_subexpressions,
                            remove_noops, remove_dead_code]
# Run on the forward and backward graphs separately, after the partition; only
# reinplace_ops introduces mutation, so it runs last.
POST_GRAD_PASSES: list[Pass] = [remove_dead_code, pad_matmuls, reinplace_ops]


@dataclass(frozen=True)
class PassStats:
    allocs_before: int
    bytes_before: int
    allocs_after: int
    bytes_after: int
    reinplaced: int
    seconds: float


def run_passes(gm: fx.GraphModule, passes: Sequence[Pass], *, dump: Optional[Callable] = None,
               prefix: str = "10", timings: Optional[dict] = None) -> fx.GraphModule:
    """Apply `passes` in order; `dump(name, gm)` after each; seconds per pass into `timings`."""
    before, start = allocation_stats(gm), time.perf_counter()
    gm.meta[REINPLACED] = 0
    deferred = [gm]  # one gm.recompile() after the last pass, not one per pass
    try:
        for i, p in enumerate(passes):
            deferred[-1].meta[DEFER_RECOMPILE] = True
            t0 = time.perf_counter()
            gm = p(gm)
            if gm is not deferred[-1]:
                deferred.append(gm)
            if timings is not None:
                timings[p.__name__] = timings.get(p.__name__, 0.0) + time.perf_counter() - t0
            if dump is not None:
                dump(f"{prefix}_{i}_{p.__name__}.py", gm)
    finally:
        for g in deferred:
            g.meta.pop(DEFER_RECOMPILE, None)
    gm.recompile()
    after = allocation_stats(gm)
    gm.meta[STATS] = PassStats(*before, *after, gm.meta.get(REINPLACED, 0),
                               time.perf_counter() - start)
    return gm


def enabled(passes: Sequence[Pass], stage: str, skip: Sequence[str]) -> list[Pass]:
    """`passes` without those named "<stage>:<pass name>" in `skip` (Config.skip_passes)."""
    return [p for p in passes if f"{stage}:{p.__name__}" not in skip]


def mark_mutable_inputs(gm: fx.GraphModule, signature: GraphSignature) -> fx.GraphModule:
    """Tell reinplace_ops / check_mutations which forward inputs the program mutates: input i
    of `signature.mutated_inputs[k]` gets its new value in output slot k."""
    gm.meta[MUTABLE_INPUTS] = {signature.inputs[i].name: k
                               for k, i in enumerate(signature.mutated_inputs)}
    return gm


__all__ = ["as_strided_views", "JOINT_PASSES", "POST_GRAD_PASSES", "run_passes", "enabled", "mark_mutable_inputs", "PassStats",
           "check_mutations", "MutationError", "register_rewrite", "Rewrite", "RULES"]
