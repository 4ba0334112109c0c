"""One min-cut over the forward part of a joint graph: which values the forward saves.

Each forward value n becomes n_in -> n_out. Cutting that edge means "computed in the forward,
saved" (capacity: save_weight * bytes); cutting source -> n_in means "computed in the
backward" (capacity: recompute_weight * recompute cost, infinite when the policy forbids it).
Data edges are infinite, and every value the backward reads connects to the sink, so any
finite cut is a valid partition and the minimum one is the cheapest under these weights.
trainc.policy tags (partition/tags.py) make one of the two edges infinite: "save" the
recompute edge, "recompute" the save edge (and allow recomputing an expensive op).
"""
from __future__ import annotations

import networkx as nx
from networkx.algorithms.flow import boykov_kolmogorov
import torch.fx as fx

from trainc.graph import JointGraph, val
from trainc.partition.cost import CostModel
from trainc.partition.split import joint_outputs, tangent_dependent
from trainc.partition.tags import RECOMPUTE, SAVE, recompute_legal


def min_cut(joint: JointGraph, costs: CostModel, *, save_weight: int, recompute_weight: int,
            under_budget: bool) -> list[fx.Node]:
    """The saved values of the cheapest cut; capacities are integers, so results are exact."""
    g, boundary = _flow_graph(joint, costs, save_weight, recompute_weight, under_budget)
    value, (source_side, _) = nx.minimum_cut(g, "source", "sink", flow_func=boykov_kolmogorov)
    if value == float("inf"):
        raise AssertionError("trainc partition: no finite cut (a value the backward needs can "
                             "neither be saved nor recomputed)")
    return saved_from_cut(joint, boundary, lambda n: (n.name, "in") in source_side)


def _flow_graph(joint: JointGraph, costs: CostModel, save_weight: int, recompute_weight: int,
                under_budget: bool) -> tuple[nx.DiGraph, list[fx.Node]]:
    backward = tangent_dependent(joint.gm)
    _, grad_outs = joint_outputs(joint)
    direct = {o for o in grad_outs if isinstance(o, fx.Node)}
    g = nx.DiGraph()
    boundary: list[fx.Node] = []
    policy = costs.policy
    for n in joint.gm.graph.nodes:
        if n.op not in ("placeholder", "call_function") or n in backward:
            continue
        c = costs[n]
        if n.op == "placeholder":
            g.add_edge("source", (n.name, "in"))
            g.add_edge((n.name, "in"), (n.name, "out"), capacity=0)
        else:
            tag = costs.tags.get(n)
            forced = tag == RECOMPUTE and recompute_legal(n, policy)
            if tag == SAVE or not (forced or policy.recomputable(n, under_budget)):
                g.add_edge("source", (n.name, "in"))
            elif c.recompute:
                g.add_edge("source", (n.name, "in"), capacity=recompute_weight * c.recompute)
            if _savable(n) and not forced:
                g.add_edge((n.name, "in"), (n.name, "out"), capacity=save_weight * c.nbytes)
            else:
                g.add_edge((n.name, "in"), (n.name, "out"))
        for u in n.users:
            if u.op == "call_function" and u not in backward:
                g.add_edge((n.name, "out"), (u.name, "in"))
        if n in direct or any(u in backward for u in n.users):
            g.add_edge((n.name, "out"), "sink")
            boundary.append(n)
    g.add_node("sink")
    return g, boundary


def _savable(n: fx.Node) -> bool:
    """A tuple (multi-output op) cannot be saved whole: its getitems are saved instead."""
    return not isinstance(val(n), (tuple, list))


def saved_from_cut(joint: JointGraph, boundary: list[fx.Node], in_forward) -> list[fx.Node]:
    """Walk back from what the backward reads: a value computed in the forward is saved, any
    other is recomputed from its inputs. Returns saved nodes in graph order."""
    saved: set[fx.Node] = set()
    seen: set[fx.Node] = set()
    work = list(boundary)
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder" or in_forward(n):
            saved.add(n)
        else:
            work.extend(n.all_input_nodes)
    return [n for n in joint.gm.graph.nodes if n in saved]
