"""Budget candidates -> more candidates: greedy flips (save <-> recompute, of one value, of a
value and one of its inputs, or of a multi-output op's outputs) that lower a plan's peak, or its
recompute cost with its peak under a cap.

The min-cut sweep is optimal for its proxy (weighted saved bytes + recompute), not for the
simulated peak: on a 1-layer MLP it found half-optimal plans at equal peak. Each flip is one
full simulation, so only graphs with at most MAX_MOVABLE movable values are refined.
"""
from __future__ import annotations

import operator
from typing import Optional, Sequence

import torch.fx as fx

from trainc.graph import JointGraph, val
from trainc.partition import budget as B
from trainc.partition.cost import CostModel
from trainc.partition.split import inputs_of, tangent_dependent

MAX_MOVABLE = 40
MAX_ROUNDS = 8


def movable_values(joint: JointGraph, costs: CostModel) -> list[fx.Node]:
    """Forward values a plan may save or recompute: whole tensors that keep bytes alive."""
    backward = tangent_dependent(joint.gm)
    return [n for n in joint.gm.graph.nodes if n.op == "call_function" and n not in backward
            and costs[n].nbytes > 0 and not isinstance(val(n), (tuple, list))]


def refined(joint: JointGraph, costs: CostModel, plans: Sequence[B.Plan]) -> list[B.Plan]:
    """`plans` plus greedy descents: to a lower peak from each plan, then to a lower recompute
    cost from each plan under each candidate's peak (as a cap)."""
    movable = movable_values(joint, costs)
    if len(movable) > MAX_MOVABLE:
        return list(plans)
    costs.cut_cache["backward"] = tangent_dependent(joint.gm)
    moves, seen = _moves(movable), {}
    out = {p.saved: p for p in plans}
    for p in plans:
        q = _descend(joint, costs, p, moves, p.memory.peak, _by_peak, seen)
        out.setdefault(q.saved, q)
    starts = list(out.values())
    for cap in sorted({p.memory.peak for p in starts}):
        for p in starts:
            if p.memory.peak <= cap:
                q = _descend(joint, costs, p, moves, cap, _by_cost, seen)
                out.setdefault(q.saved, q)
    return list(out.values())


def _moves(movable: list[fx.Node]) -> list[set]:
    """One value, a value and one of its inputs (save one instead of the other), or all
    outputs of one multi-output op."""
    ok = set(movable)
    moves = [{v} for v in movable] + [{v, a} for v in movable for a in v.all_input_nodes
                                      if a in ok]
    tuples: dict[fx.Node, set] = {}
    for v in movable:
        if v.target is operator.getitem and isinstance(v.args[0], fx.Node):
            tuples.setdefault(v.args[0], set()).add(v)
    return moves + [group for group in tuples.values() if len(group) > 1]


def _by_cost(p: B.Plan) -> tuple:
    return p.recompute_cost, p.memory.peak


def _by_peak(p: B.Plan) -> tuple:
    return p.memory.peak, p.recompute_cost


def _descend(joint: JointGraph, costs: CostModel, plan: B.Plan, moves: list[set], cap: int,
             key, seen: dict) -> B.Plan:
    best = plan
    for _ in range(MAX_ROUNDS):
        step = None
        for move in moves:
            saved = frozenset(best.saved) ^ move
            if saved not in seen:
                seen[saved] = _try(joint, costs, saved)
            q = seen[saved]
            if q is not None and q.memory.peak <= cap and key(q) < key(step or best):
                step = q
        if step is None:
            break
        best = step
    return best


def _try(joint: JointGraph, costs: CostModel, saved: set) -> Optional[B.Plan]:
    """The plan saving `saved` (the primals it reads added, unread values dropped), or None
    when it recomputes what policy or tags forbid."""
    primals, _ = inputs_of(joint)
    order = [n for n in joint.gm.graph.nodes if n in saved or n in primals]
    plan = B.evaluate(joint, costs, order, "refined")
    if any(not costs.policy.recomputable(n, True) for n in plan.recomputed) or \
            not B.honours_tags(plan, costs):
        return None
    read = {a for n in plan.recomputed for a in n.all_input_nodes}
    read |= {a for n in costs.cut_cache["backward"] for a in n.all_input_nodes}
    read |= {o for o in joint.gm.graph.output_node().all_input_nodes}
    kept = [n for n in order if n in read]
    return B.evaluate(joint, costs, kept, "min-cut + greedy flips") if kept != order else plan
