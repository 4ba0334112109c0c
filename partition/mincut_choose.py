"""The min-cut partitioner: without a budget, the fewest saved bytes that recompute no expensive
op ("bytes") or the least saved bytes + recompute cost ("balanced", Config.partition_objective);
with one, the least recompute whose simulated peak memory fits (see budget.py)."""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch.fx as fx

from trainc.config import Config
from trainc.graph import JointGraph
from trainc.partition import budget as B
from trainc.partition.cost import CostModel
from trainc.partition.mincut import min_cut
from trainc.partition.refine import refined
from trainc.partition.save_all import save_all_nodes


def default_saved(joint: JointGraph, costs: CostModel) -> list[fx.Node]:
    """Bytes first, recompute cost as the tie-break: save weight exceeds any recompute total."""
    big = sum(c.recompute for c in costs.costs.values()) + 1
    return min_cut(joint, costs, save_weight=big, recompute_weight=1, under_budget=False)


# The balanced objective's recompute cost: one FLOP per byte (a GPU-like 32 made recompute
# look free next to saving on CPUs; BENCHMARKS.md)
BALANCED_FLOPS_PER_BYTE = 1.0


def balanced_saved(joint: JointGraph, costs: CostModel) -> list[fx.Node]:
    """Saved bytes and recompute cost weighed alike (recompute in byte-equivalents, FLOPs at
    BALANCED_FLOPS_PER_BYTE)."""
    costs = CostModel(joint.gm, dataclasses.replace(costs.policy,
                                                    flops_per_byte=BALANCED_FLOPS_PER_BYTE),
                      fuses=costs.fuses)
    return min_cut(joint, costs, save_weight=1, recompute_weight=1, under_budget=False)


OBJECTIVES = {"bytes": default_saved, "balanced": balanced_saved}


def choose_mincut(joint: JointGraph, costs: CostModel,
                  config: Config) -> tuple[list[fx.Node], str, Optional[str]]:
    saved = OBJECTIVES[config.partition_objective or "bytes"](joint, costs)
    if config.memory_budget is None:
        return saved, "default", None
    default = B.evaluate(joint, costs, saved, "default")
    plans = budget_plans(joint, costs, default)
    best, note = B.choose(plans, default, config.memory_budget, B.fixed_bytes(costs),
                          f"a graph of {len(joint.gm.graph.nodes)} nodes")
    return list(best.saved), "budget", note


def budget_plans(joint: JointGraph, costs: CostModel, default: B.Plan) -> list[B.Plan]:
    """Every candidate, the save-all and `default` plans among them. Cached on the graph module
    per policy, so partitioning one graph at several budgets sweeps once."""
    cache = joint.gm.meta.setdefault("trainc_budget_plans", {})
    key = costs.policy, costs.fuses
    if key not in cache:
        save_all = B.evaluate(joint, costs, save_all_nodes(joint), "save_all")
        cache[key] = refined(joint, costs, B.candidates(joint, costs, [save_all, default]))
    return cache[key]
