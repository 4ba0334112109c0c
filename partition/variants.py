"""Several joint graphs of one program (the first speed-optimal, the others leaner rewrites, e.g.
the LM-head loss in row chunks) + a memory budget -> which graph to use and its Partition.

The budget reads against the first graph's default plan and the lowest peak of any graph's
plans; the least-recompute plan of any graph under the cap wins, the earlier graph on a tie
(a rewrite costs nothing in recompute: the chunked loss moves the head's gradient work into
the forward), so without a budget, or where a plain plan is as cheap, nothing is rewritten.
The chosen predicted peak falls monotonically with the budget: a lower cap keeps the same plan
or picks one under the lower cap.

With `predictor` (the pipeline's, where the backend generates code: a graph and its cost model
-> a plan's predicted step peak from the wrappers' memory plans), the budget reads against those
predictions: the default plan's, and the lowest of each graph's leanest plan. Where saved values
may move to host memory (Config.offload), a plan's prediction is its peak with the most moved,
the default plan's too; mixes whose first layers are cut as the default plan's join the ladder
(their values have the longest to copy), and the first graph that fits wins.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from trainc.config import Config
from trainc.graph import JointGraph
from trainc.partition import Partition, build_partition, generates_kernels, partition
from trainc.partition import budget as B
from trainc.partition import policy as P
from trainc.partition.cost import CostModel
from trainc.partition.mincut_choose import OBJECTIVES, budget_plans


def chooses_variants(config: Config) -> bool:
    """Whether partition_variants can pick anything but the first graph: a min-cut under a
    budget that is not the default plan."""
    b = config.memory_budget
    return config.partitioner == "mincut" and b is not None and not (
        isinstance(b, float) and b >= 1.0)


# Offload mixes: how many rungs to mix (the chosen and leaner), in how many steps of the forward
EARLY_RUNGS = 2
EARLY_STEPS = 8

Predictor = Callable[[JointGraph, CostModel], B.Predict]


def partition_variants(joints: Sequence[JointGraph], config: Config,
                       predictor: Optional[Predictor] = None) -> tuple[int, Partition]:
    """(index of the chosen graph, its partition)."""
    if not chooses_variants(config) or (len(joints) == 1 and predictor is None):
        return 0, partition(joints[0], config)
    policy = getattr(config, "policy", None) or P.DEFAULT_POLICY
    objective = OBJECTIVES[config.partition_objective or "bytes"]
    searched = []
    for joint in joints:
        costs = CostModel(joint.gm, policy, fuses=generates_kernels(config))
        default = B.evaluate(joint, costs, objective(joint, costs), "default")
        searched.append((joint, costs, default, budget_plans(joint, costs, default)))
    if predictor is not None:
        return _by_prediction(searched, config, predictor)
    lows = [B.lowest([*plans, default]) for _, _, default, plans in searched]
    low = B.lowest(lows)
    joint0, costs0, default0, _ = searched[0]
    name = f"a graph of {len(joint0.gm.graph.nodes)} nodes"
    cap, note = B.budget_cap(config.memory_budget, default0, low, B.fixed_bytes(costs0), name)
    if cap is None:
        return 0, build_partition(joint0, costs0, list(default0.saved), "budget", note)
    fits = [(best.recompute_cost, i, best) for i, (_, _, default, plans) in enumerate(searched)
            if (best := B.best_under([*plans, default], cap)) is not None]
    _, i, best = min(fits, key=lambda f: f[:2]) if fits else (0, lows.index(low), low)
    joint, costs = searched[i][:2]
    return i, build_partition(joint, costs, list(best.saved), "budget", None)


def _by_prediction(searched: list, config: Config, predictor: Predictor) -> tuple[int, Partition]:
    """The least-recompute plan of any graph whose predicted step peak fits the budget's cap,
    the cap read against predicted peaks (budget.predicted_cap)."""
    rungs = [B.ladder(plans, default) for _, _, default, plans in searched]
    preds = [B.Predictions(predictor(joint, costs)) for joint, costs, _, _ in searched]
    joint0, costs0, default0, _ = searched[0]
    # where saved values may move to host (trainc/offloading.py), a plan's prediction is its
    # peak with the most moved; the default plan moves none
    base = getattr(preds[0].predict, "base", preds[0])
    default_peak = base(default0)
    # with offload the default plan, most moved, may be the lowest
    lows = [min(p(r[0]), p(r[-1])) if hasattr(p.predict, "offload") else p(r[0])
            for p, r in zip(preds, rungs)]
    name = f"a graph of {len(joint0.gm.graph.nodes)} nodes"
    cap, note = B.predicted_cap(config.memory_budget, default_peak, min(lows),
                                B.fixed_bytes(costs0), name)
    limit = getattr(preds[0].predict, "limit", None)
    if cap is None:
        note += f"; offload: {limit(rungs[0][-1])}" if limit else ""
        return 0, build_partition(joint0, costs0, list(default0.saved), "budget", note)
    i, best, tried = _least_recompute(searched, rungs, preds, cap)
    joint, costs = searched[i][:2]
    moves = getattr(preds[i].predict, "offload", None)
    moved, chosen = moves(best, cap) if moves else ((), preds[i](best))
    note = B.predicted_note(cap, default_peak, min(lows), chosen,
                            sum(len(p.peaks) for p in preds))
    if moves:
        note += (f"; {len(moved)} saved values moved to host memory "
                 f"({preds[i].predict.limit(best)})")
    part = build_partition(joint, costs, list(best.saved), "budget", note, offload=moved)
    return i, dataclasses.replace(part, search=B.search_table(rungs, preds, cap, best, tried))


def _least_recompute(searched: list, rungs: list, preds: list, cap: int) -> tuple:
    """(graph index, its least-recompute plan whose prediction fits `cap`, the offload mixes
    tried). Where values move, offload mixes join each graph's ladder, and the first graph
    that fits wins: a rewrite (the chunked loss) costs step time the recompute cost does not
    count. Otherwise the least recompute of any graph, the earlier graph on a tie."""
    fits, tried = [], []
    for i, (r, p) in enumerate(zip(rungs, preds)):
        best = B.last_under(r, p, cap)
        if best is None:
            continue
        moves = hasattr(p.predict, "offload")
        if moves and best is not r[-1]:
            mixes = _early_saved(searched[i], r, p, best, cap)
            tried += [(i, m) for m in mixes]
            best = min([best, *(m for m in mixes if p(m) <= cap)],
                       key=lambda q: (q.recompute_cost, p(q)))
        fits.append((best.recompute_cost, i, best))
        if moves:
            break
    _, i, best = min(fits, key=lambda f: f[:2])  # the leanest graph's leanest rung fits
    return i, best, tried


def _early_saved(searched: tuple, rungs: list, predicted: B.Predictions, best: B.Plan,
                 cap: int) -> list:
    """Offload mixes (budget.early_saved) that may beat `best` where saved values move: of
    `best` and of the EARLY_RUNGS - 1 rungs leaner than it, k = 1, 2, ... steps of the forward
    cut as the default plan, up to the first whose predicted peak exceeds `cap` (the prediction
    rises with k once more is saved than the link moves in time, after a step or two on the
    Llama). Every mix predicted, in the order tried."""
    joint, costs = searched[:2]
    at = next(i for i, r in enumerate(rungs) if r is best)
    tried = []
    for plan in rungs[max(at - EARLY_RUNGS + 1, 0):at + 1][::-1]:
        for k in range(1, EARLY_STEPS):
            tried.append(B.early_saved(joint, costs, plan, k, EARLY_STEPS))
            if predicted(tried[-1]) > cap:
                break
    return tried
