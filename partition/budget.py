"""Memory-budget search: min-cuts over a sweep of save/recompute weights give candidate plans;
each is scored by its simulated peak memory; the cheapest-to-recompute plan under the cap wins.

The budget is read against two reference plans: `default` (the speed-optimal plan, what no
budget gives) and `low` (the lowest simulated peak any candidate reaches).
- a float f in [0, 1] caps the peak at low + f * (default - low): 1.0 is the default plan,
  0.0 the lowest-peak plan;
- an int caps the predicted peak in bytes: the graph's inputs plus its simulated peak.
No budget picks a plan above the default's peak, and the least-recompute choice under a cap
makes the chosen peak fall monotonically with the budget.

Where the backend generates code, the pipeline gives a `predict` function (a plan -> the step's
peak from the wrappers' own memory plans, partition/step_peak.py) and the cap reads against
those predictions instead (`choose_predicted`): the simulation above only orders the plans.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch.fx as fx

from trainc.graph import JointGraph
from trainc.partition.cost import CostModel
from trainc.partition.memory import MemoryProfile, simulate
from trainc.partition.mincut import forward_side, min_cut, min_cut_mixed, mixed_cut
from trainc.partition.split import execution_order, joint_outputs, tangent_dependent
from trainc.partition.tags import RECOMPUTE, SAVE, recompute_legal

SWEEP_EXPONENTS = range(-6, 17)  # save weight / recompute weight = 2**k
# Mixed plans per pair of neighbouring sweep plans, less one (each is one simulation)
MIX_STEPS = 16


class BudgetError(ValueError):
    """A memory budget no partition meets; the message names the smallest feasible budget."""


@dataclass(frozen=True)
class Plan:
    saved: tuple[fx.Node, ...]
    recomputed: tuple[fx.Node, ...]  # forward values the backward recomputes
    memory: MemoryProfile
    recompute_cost: int  # byte-equivalents (the search's objective)
    recompute_flops: int
    label: str  # which search produced it


def evaluate(joint: JointGraph, costs: CostModel, saved: Sequence[fx.Node], label: str) -> Plan:
    fwd, bwd = execution_order(joint, saved)
    backward = tangent_dependent(joint.gm)
    recomputed = tuple(n for n in bwd if n not in backward)
    fwd_outs, grad_outs = joint_outputs(joint)
    memory = simulate(costs, fwd, bwd, fwd_outs, saved, grad_outs)
    return Plan(tuple(saved), recomputed, memory, sum(costs[n].recompute for n in recomputed),
                sum(costs[n].flops for n in recomputed), label)


def candidates(joint: JointGraph, costs: CostModel, extra: Sequence[Plan] = ()) -> list[Plan]:
    """Distinct plans from min-cuts at a sweep of weights, from 'recompute nothing' to 'save
    the fewest bytes', plus those of `extra` (the save-all and default plans) that honour the
    trainc.policy tags."""
    big = _big(costs)
    weights = [(1, big)] + [(2**k, 1) if k >= 0 else (1, 2**-k) for k in SWEEP_EXPONENTS]
    weights.append((big, 1))
    plans = {tuple(n.name for n in p.saved): p for p in extra if honours_tags(p, costs)}
    swept: list[tuple[Plan, tuple[int, int]]] = []
    for a, r in weights:
        saved = min_cut(joint, costs, save_weight=a, recompute_weight=r, under_budget=True)
        key = tuple(n.name for n in saved)
        if key not in plans:
            plans[key] = evaluate(joint, costs, saved, f"min-cut save:recompute weight {a}:{r}")
            swept.append((plans[key], (a, r)))
    for plan in mixed(joint, costs, swept):
        plans.setdefault(tuple(n.name for n in plan.saved), plan)
    return list(plans.values())


def mixed(joint: JointGraph, costs: CostModel,
          swept: Sequence[tuple[Plan, tuple[int, int]]]) -> list[Plan]:
    """Plans between two neighbours on the sweep's frontier (peak vs recompute): the first k/L
    of the forward (the first layers) cut as the leaner plan, the rest as the faster one, k = 1
    .. L-1 (L = MIX_STEPS). The sweep alone cuts every layer alike, so between its plans the
    peak jumps by all layers' worth of saved values (a 16-layer Llama: nothing between budget 0
    and the default)."""
    layers = MIX_STEPS
    front = frontier([p for p, _ in swept])
    weights = {id(p): w for p, w in swept}
    out = []
    for lean, fast in zip(front, front[1:]):
        for k in range(1, layers):
            saved = min_cut_mixed(joint, costs, weights[id(lean)], weights[id(fast)],
                                  k / layers)
            a, b = weights[id(fast)], weights[id(lean)]
            out.append(evaluate(joint, costs, saved, f"min-cut mix: the first {k}/{layers} of "
                                f"the forward at weight {b[0]}:{b[1]}, the rest {a[0]}:{a[1]}"))
    return out


def _big(costs: CostModel) -> int:
    """A weight above any cut's total cost: (1, big) recomputes nothing the cut can save."""
    return sum(c.recompute + c.nbytes for c in costs.costs.values()) + 1


def early_saved(joint: JointGraph, costs: CostModel, plan: Plan, k: int,
                layers: int = MIX_STEPS) -> Plan:
    """`plan` with the first k/layers of the forward cut as the default plan cuts it (no
    expensive op recomputed): the shape a plan wants where saved values move to host memory.
    The forward makes the first layers' values earliest, so their copies have the longest to
    run, and the backward reads them last; the later layers' values, which could not reach the
    host in time, stay recomputed as `plan` has them."""
    default = forward_side(joint, costs, _big(costs), 1, False)
    saved = mixed_cut(joint, costs, default, set(plan.saved), k / layers)
    return evaluate(joint, costs, saved, f"offload mix: the first {k}/{layers} of the forward "
                    f"as the default plan, the rest as the plan with recompute "
                    f"{plan.recompute_cost}")


def frontier(plans: Sequence[Plan]) -> list[Plan]:
    """The plans no other beats in both peak and recompute cost, by rising peak."""
    out: list[Plan] = []
    for p in sorted(plans, key=lambda p: (p.memory.peak, p.recompute_cost)):
        if not out or p.recompute_cost < out[-1].recompute_cost:
            out.append(p)
    return out


def honours_tags(plan: Plan, costs: CostModel) -> bool:
    """No "save" value recomputed, no legally recomputable "recompute" value saved (the
    min-cut's plans honour them by construction; save-all ignores them)."""
    return not any(costs.tags.get(n) == SAVE for n in plan.recomputed) and not any(
        costs.tags.get(n) == RECOMPUTE and recompute_legal(n, costs.policy) for n in plan.saved)


def lowest(plans: Sequence[Plan]) -> Plan:
    """The lowest-peak plan; ties: fewer saved bytes (a graph whose peak no plan moves should
    still save the least at budget 0), then less recompute."""
    return min(plans, key=lambda p: (p.memory.peak, p.memory.saved_bytes, p.recompute_cost))


def choose(plans: Sequence[Plan], default: Plan, budget: Union[int, float], fixed_bytes: int,
           graph_name: str = "graph") -> tuple[Plan, Optional[str]]:
    """The least-recompute plan whose simulated peak fits the budget's cap; (plan, note).
    `fixed_bytes` (the graph's inputs) is what an int budget counts beside the simulated peak."""
    low = lowest([*plans, default])
    cap, note = budget_cap(budget, default, low, fixed_bytes, graph_name)
    if cap is None:
        return default, note
    return best_under([*plans, default], cap) or low, None


def budget_cap(budget: Union[int, float], default: Plan, low: Plan, fixed_bytes: int,
               graph_name: str = "graph") -> tuple[Optional[int], Optional[str]]:
    """(the cap on the simulated peak, note); cap None: the budget gives the default plan.
    Raises BudgetError for an int budget below the lowest predicted peak."""
    if isinstance(budget, float):
        if budget >= 1.0:
            return None, None
        cap = low.memory.peak + int(budget * (default.memory.peak - low.memory.peak))
        if cap >= default.memory.peak:  # no plan lowers the peak: stay the speed-optimal plan
            return None, "no partition found lowers the simulated peak below the default plan's"
        return cap, None
    cap = budget - fixed_bytes
    if cap < low.memory.peak:
        smallest = low.memory.peak + fixed_bytes
        raise BudgetError(
            f"trainc: memory_budget={budget} bytes is infeasible for {graph_name}: the "
            f"lowest predicted peak any partition reaches is {smallest} bytes ({fixed_bytes} "
            f"of them the graph's inputs): it needs memory_budget >= {smallest} bytes, "
            "the smallest feasible")
    return (None, None) if cap >= default.memory.peak else (cap, None)


def best_under(plans: Sequence[Plan], cap: int) -> Optional[Plan]:
    """The least-recompute plan with a simulated peak <= cap (ties: lower peak, fewer saved
    bytes); None when none fits."""
    fits = [p for p in plans if p.memory.peak <= cap]
    return min(fits, key=lambda p: (p.recompute_cost, p.memory.peak, p.memory.saved_bytes)) \
        if fits else None


def fixed_bytes(costs: CostModel) -> int:
    """Bytes of the graph's inputs (parameters, user inputs, tangents): live for the whole
    graph whatever the partition."""
    return sum(costs.storage_bytes[s] for s in costs.input_storages)


Predict = Callable[[Plan], int]  # a plan -> its step's predicted peak in bytes (step_peak.py)


class Predictions:
    """Memoised predictions of one graph's plans, counted (each one is a memory-only codegen of
    both graphs: codegen/driver.py memory_plan_only)."""

    def __init__(self, predict: Predict):
        self.predict, self.peaks = predict, {}

    def __call__(self, plan: Plan) -> int:
        key = _key(plan)
        if key not in self.peaks:
            self.peaks[key] = self.predict(plan)
        return self.peaks[key]

    def known(self, plan: Plan) -> Optional[int]:
        """The plan's predicted peak if the search predicted it, else None (predicts nothing)."""
        return self.peaks.get(_key(plan))


def _key(plan: Plan) -> tuple:
    return tuple(n.name for n in plan.saved)


def ladder(plans: Sequence[Plan], default: Plan) -> list[Plan]:
    """The frontier's plans below the default's simulated peak, by rising peak (falling
    recompute), then the default: the plans a budget chooses between."""
    return [p for p in frontier([*plans, default]) if p.memory.peak < default.memory.peak and
            p.recompute_cost > default.recompute_cost] + [default]


def predicted_cap(budget: Union[int, float], default_peak: int, low_peak: int, fixed_bytes: int,
                  graph_name: str = "graph") -> tuple[Optional[int], Optional[str]]:
    """budget_cap over predicted peaks: (cap, note); cap None gives the default plan."""
    if isinstance(budget, float):
        if budget >= 1.0:
            return None, None
        if low_peak >= default_peak:
            return None, "no partition found lowers the predicted peak below the default plan's"
        return low_peak + int(budget * (default_peak - low_peak)), None
    cap = budget - fixed_bytes
    if cap < low_peak:
        smallest = low_peak + fixed_bytes
        raise BudgetError(
            f"trainc: memory_budget={budget} bytes is infeasible for {graph_name}: the "
            f"lowest predicted peak any partition reaches is {smallest} bytes ({fixed_bytes} "
            f"of them the graph's inputs): it needs memory_budget >= {smallest} bytes, "
            "the smallest feasible")
    return (None, None) if cap >= default_peak else (cap, None)


def predicted_note(cap: int, default_peak: int, low: int, chosen: int, predicted: int) -> str:
    """How a budget's cap on predicted peaks was read and met, for explain()."""
    mib = 2 ** 20
    return (f"budget: predicted step peak cap {cap / mib:.3f} MiB (default plan "
            f"{default_peak / mib:.3f}, lowest found {low / mib:.3f}); chosen plan "
            f"{chosen / mib:.3f} MiB; {predicted} plans predicted")


def search_table(rungs: Sequence[Sequence[Plan]], preds: Sequence[Predictions], cap: int,
                 chosen: Plan, mixes: Sequence[tuple[int, Plan]] = ()) -> str:
    """The budget's search as a table (the 21_budget_search.txt dump): every rung of every
    graph, its recompute cost and simulated peak, and its predicted peak where the search
    predicted it (with the offload detail where values may move), then the offload mixes the
    search tried (`mixes`: (graph, plan), rung "m"); `*` marks the chosen plan."""
    mib = 2 ** 20
    out = [f"cap {cap / mib:.1f} MiB; rungs by rising simulated peak, the default plan "
           "last (graph 0: the model as traced, later graphs: its rewrites)",
           f"  {'graph':>5} {'rung':>4} {'recompute':>12} {'GFLOP':>8} {'simulated MiB':>13} "
           f"{'predicted MiB':>13}  detail"]
    rows = [(g, str(i), r) for g, rs in enumerate(rungs) for i, r in enumerate(rs)]
    rows += [(g, "m", r) for g, r in mixes]
    for g, rung, r in rows:
        pred = preds[g]
        describe = getattr(pred.predict, "describe", None)
        got = pred.known(r)
        shown = f"{got / mib:.1f}" if got is not None else "-"
        detail = describe(r) if describe and got is not None else ""
        detail = "; ".join(filter(None, (r.label, detail))) if rung == "m" else detail
        mark = "*" if r is chosen else " "
        out.append(f"{mark} {g:>5} {rung:>4} {r.recompute_cost:>12} "
                   f"{r.recompute_flops / 1e9:>8.2f} {r.memory.peak / mib:>13.1f} "
                   f"{shown:>13}  {detail}".rstrip())
    return "\n".join(out) + "\n"


def last_under(rungs: Sequence[Plan], predicted: Predictions, cap: int) -> Optional[Plan]:
    """The rung with the least recompute whose predicted peak fits `cap` (the predictions rise
    along the ladder as the simulation does); None when the leanest does not fit. Each
    prediction is a memory-only codegen of both graphs, so the search guesses first: the cap
    mapped onto the simulated peaks (the two move nearly in step), that rung and its neighbour
    predicted; a bisection of what is left only when the guess was off."""
    if not rungs:
        return None
    lo, hi = 0, len(rungs) - 1
    if predicted(rungs[hi]) <= cap:  # (with offload, the default may be under its leaner rungs)
        return rungs[hi]
    if predicted(rungs[0]) > cap:
        return None
    if hi - lo > 1:
        g = _guess(rungs, predicted, lo, hi, cap)
        lo, hi = (g, hi) if predicted(rungs[g]) <= cap else (lo, g)
        near = lo + 1 if lo == g else hi - 1  # the guess's neighbour towards the other bound
        if lo < near < hi:
            lo, hi = (near, hi) if predicted(rungs[near]) <= cap else (lo, near)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if predicted(rungs[mid]) <= cap else (lo, mid)
    return rungs[lo]


def _guess(rungs: Sequence[Plan], predicted: Predictions, lo: int, hi: int, cap: int) -> int:
    """The last rung strictly between lo and hi whose simulated peak is at most the one the cap
    maps to, the map linear between the bounds (simulated peak -> predicted peak)."""
    p_lo, p_hi = predicted(rungs[lo]), predicted(rungs[hi])
    s_lo, s_hi = rungs[lo].memory.peak, rungs[hi].memory.peak
    target = s_lo + (cap - p_lo) * (s_hi - s_lo) / max(p_hi - p_lo, 1)
    mid = lo + 1
    while mid + 1 < hi and rungs[mid + 1].memory.peak <= target:
        mid += 1
    return mid
