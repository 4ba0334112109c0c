"""Memory-budget search: min-cuts over a sweep of save/recompute weights give candidate plans;
each is scored by its simulated peak memory; the cheapest-to-recompute plan under the cap wins.

The budget limits activation memory: a plan may use `base + budget_bytes` of simulated peak,
where base = (save-all peak) - (save-all activation bytes). Choosing the least recompute among
plans under the cap (ties: lower peak) makes the chosen peak fall monotonically with the budget.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch.fx as fx

from trainc.graph import JointGraph
from trainc.partition.cost import CostModel
from trainc.partition.memory import MemoryProfile, simulate
from trainc.partition.mincut import min_cut
from trainc.partition.split import execution_order, joint_outputs, tangent_dependent

SWEEP_EXPONENTS = range(-6, 17)  # save weight / recompute weight = 2**k


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
    the fewest bytes', plus `extra` (the save-all and default plans)."""
    big = sum(c.recompute + c.nbytes for c in costs.costs.values()) + 1
    weights = [(1, big)] + [(2**k, 1) if k >= 0 else (1, 2**-k) for k in SWEEP_EXPONENTS]
    weights.append((big, 1))
    plans = {tuple(n.name for n in p.saved): p for p in extra}
    for a, r in weights:
        saved = min_cut(joint, costs, save_weight=a, recompute_weight=r, under_budget=True)
        key = tuple(n.name for n in saved)
        if key not in plans:
            plans[key] = evaluate(joint, costs, saved, f"min-cut save:recompute weight {a}:{r}")
    return list(plans.values())


def budget_bytes(budget: Union[int, float], activation_bytes: int) -> int:
    if isinstance(budget, float):
        return int(budget * activation_bytes)
    return int(budget)


def choose(plans: Sequence[Plan], save_all: Plan, budget: Union[int, float],
           graph_name: str = "graph") -> tuple[Plan, Optional[str]]:
    """The least-recompute plan whose simulated peak fits the budget; (plan, note)."""
    acts = save_all.memory.saved_bytes
    base = save_all.memory.peak - acts
    floor = min(p.memory.peak for p in plans)
    cap = base + budget_bytes(budget, acts)
    note = None
    if cap < floor:
        smallest = max(0, floor - base)
        frac = f" (memory_budget={smallest / acts:.3f} as a fraction)" if acts else ""
        if isinstance(budget, int):
            raise BudgetError(
                f"trainc: memory_budget={budget} bytes is infeasible for {graph_name}: the "
                f"lowest simulated peak any partition reaches is {floor} bytes, which needs "
                f"memory_budget >= {smallest} bytes{frac}")
        note = (f"memory_budget={budget} is below the smallest feasible {smallest} bytes"
                f"{frac}: using the lowest-peak plan")
        # The user asked for less than any plan reaches: least memory first, also in saved
        # bytes (else a graph whose peak no plan moves would keep everything at budget 0).
        return min(plans, key=lambda p: (p.memory.peak, p.memory.saved_bytes,
                                         p.recompute_cost)), note
    fits = [p for p in plans if p.memory.peak <= cap]
    best = min(fits, key=lambda p: (p.recompute_cost, p.memory.peak, p.memory.saved_bytes))
    return best, note
