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

from dataclasses import dataclass

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
    _, boundary = _parts(joint, costs, under_budget)
    in_forward = forward_side(joint, costs, save_weight, recompute_weight, under_budget)
    return saved_from_cut(joint, boundary, in_forward.__contains__)


def forward_side(joint: JointGraph, costs: CostModel, save_weight: int, recompute_weight: int,
                 under_budget: bool) -> set[fx.Node]:
    """The values the cheapest cut computes in the forward."""
    parts, _ = _parts(joint, costs, under_budget)
    solved = costs.cut_cache.setdefault("solved", {})
    in_forward: set[fx.Node] = set()
    for part in parts:
        key = part.key, save_weight, recompute_weight
        if key not in solved:
            solved[key] = _solve(part, save_weight, recompute_weight)
        in_forward.update(part.nodes[i] for i in solved[key])
    return in_forward


def min_cut_mixed(joint: JointGraph, costs: CostModel, early: tuple[int, int],
                  late: tuple[int, int], fraction: float) -> list[fx.Node]:
    """A budget plan (expensive ops recomputable) mixing two cuts (save weight, recompute
    weight): the first `fraction` of the forward's nodes in graph order follow `early`'s cut,
    the rest `late`'s. On a stack of layers with a lean `early`, the backward reaches the lean
    layers last, when the other layers' saved values are gone, so recomputing there raises the
    backward's peak least."""
    return mixed_cut(joint, costs, forward_side(joint, costs, *early, True),
                     forward_side(joint, costs, *late, True), fraction)


def mixed_cut(joint: JointGraph, costs: CostModel, early: set[fx.Node], late: set[fx.Node],
              fraction: float) -> list[fx.Node]:
    """The saved values of two cuts' forward sides mixed: the first `fraction` of the forward's
    nodes in graph order as `early` has them, the rest as `late`. Any mix is a valid partition:
    a value neither side computes in the forward is recomputed from what is."""
    _, boundary = _parts(joint, costs, True)
    place = _forward_place(joint, costs)
    return saved_from_cut(joint, boundary, lambda n: n in early if place.get(n, 0.0) < fraction
                          else n in late)


def _forward_place(joint: JointGraph, costs: CostModel) -> dict[fx.Node, float]:
    """Each forward op's place in the forward, from 0 to 1: its rank among the ops before the
    backward's first, in graph order; an op the tracer placed among the backward's (a weight's
    transpose, the part of an activation's derivative that needs no tangent) takes its latest
    input's place, the layer it belongs to."""
    cache = costs.cut_cache
    if "forward_place" not in cache:
        backward = cache.setdefault("tangent_dependent", tangent_dependent(joint.gm))
        ops = [n for n in joint.gm.graph.nodes if n.op == "call_function" and n not in backward]
        first_bwd = next((i for i, n in enumerate(joint.gm.graph.nodes)
                          if n.op == "call_function" and n in backward), None)
        index = {n: i for i, n in enumerate(joint.gm.graph.nodes)}
        ahead = [n for n in ops if first_bwd is None or index[n] < first_bwd]
        place = {n: i / max(len(ahead), 1) for i, n in enumerate(ahead)}
        for n in ops:
            if n not in place:
                place[n] = max((place.get(a, 0.0) for a in n.all_input_nodes), default=0.0)
        cache["forward_place"] = place
    return cache["forward_place"]


@dataclass(frozen=True)
class _Part:
    """One weakly connected piece of the flow graph. An edge out of a node whose n_out must
    (or may at no cost) sit on the sink side never crosses the cut, so dropping it changes no
    cut: the pieces are solved apart, and pieces with equal `key` (the repeated layers of a
    model) share one solution per weight. A constant (an op without inputs, e.g. the -inf of
    every attention mask) read by several pieces is copied into each: its save or recompute
    cost counts once per piece, and it is computed in the forward if any piece says so."""
    nodes: tuple[fx.Node, ...]  # graph order; local index = position
    key: tuple  # per node: (recompute capacity, save capacity, to sink, local successors)


def _parts(joint: JointGraph, costs: CostModel,
           under_budget: bool) -> tuple[list[_Part], list[fx.Node]]:
    cache = costs.cut_cache.setdefault("parts", {})
    if under_budget not in cache:
        cache[under_budget] = _split_parts(joint, costs, under_budget)
    return cache[under_budget]


def _split_parts(joint: JointGraph, costs: CostModel,
                 under_budget: bool) -> tuple[list[_Part], list[fx.Node]]:
    backward = tangent_dependent(joint.gm)
    _, grad_outs = joint_outputs(joint)
    direct = {o for o in grad_outs if isinstance(o, fx.Node)}
    nodes = [n for n in joint.gm.graph.nodes
             if n.op in ("placeholder", "call_function") and n not in backward]
    attrs: dict[fx.Node, tuple] = {}
    boundary: list[fx.Node] = []
    shared: list[fx.Node] = []  # constants (no inputs) read by several layers: -inf, masks
    parent = {n: n for n in nodes}
    for n in nodes:
        sink = n in direct or any(u in backward for u in n.users)
        if sink:
            boundary.append(n)
        src, mid = _capacities(n, costs, under_budget)
        succ = [u for u in n.users if u.op == "call_function" and u not in backward]
        if sink or mid == 0:  # n_out on the sink side costs nothing: its edges never count
            succ = []
        if n.op == "call_function" and not n.all_input_nodes and succ:
            shared.append(n)
        else:
            for u in succ:
                _union(parent, n, u)
        attrs[n] = (src, mid, sink, succ)
    groups: dict[fx.Node, list[fx.Node]] = {}
    for n in nodes:
        if n not in shared:
            groups.setdefault(_find(parent, n), []).append(n)
    for c in shared:  # a copy in each piece that reads it
        for root in {_find(parent, u) for u in attrs[c][3]}:
            groups[root].append(c)
    order = {n: i for i, n in enumerate(nodes)}
    parts = []
    for members in groups.values():
        members.sort(key=order.__getitem__)
        local = {n: i for i, n in enumerate(members)}
        key = tuple((src, mid, sink, tuple(sorted(local[u] for u in succ if u in local)))
                    for src, mid, sink, succ in (attrs[n] for n in members))
        parts.append(_Part(tuple(members), key))
    return parts, boundary


INF = None  # an uncut-able edge (networkx: no capacity attribute)


def _capacities(n: fx.Node, costs: CostModel, under_budget: bool) -> tuple:
    """(recompute capacity, save capacity) before weights: 0 = free, INF = forbidden."""
    if n.op == "placeholder":
        return INF, 0
    c = costs[n]
    policy = costs.policy
    tag = costs.tags.get(n)
    forced = tag == RECOMPUTE and recompute_legal(n, policy)
    if tag == SAVE or not (forced or policy.recomputable(n, under_budget)):
        src = INF
    else:
        src = c.recompute
    mid = c.nbytes if _savable(n) and not forced else INF
    return src, mid


def _solve(part: _Part, save_weight: int, recompute_weight: int) -> frozenset[int]:
    """Local indices of the part's nodes computed in the forward (n_in on the source side)."""
    if not any(sink for _, _, sink, _ in part.key):
        return frozenset(range(len(part.nodes)))
    edges: list = []  # one add_edges_from: add_edge per edge was a third of a 32-layer sweep
    free: dict = {}
    for i, (src, mid, sink, succ) in enumerate(part.key):
        if src is INF:
            edges.append(("source", (i, 0), free))
        elif src:
            edges.append(("source", (i, 0), {"capacity": recompute_weight * src}))
        edges.append(((i, 0), (i, 1), free if mid is INF else {"capacity": save_weight * mid}))
        edges.extend(((i, 1), (j, 0), free) for j in succ)
        if sink:
            edges.append(((i, 1), "sink", free))
    g = nx.DiGraph()
    g.add_node("source")
    g.add_edges_from(edges)
    value, (source_side, _) = nx.minimum_cut(g, "source", "sink", flow_func=boykov_kolmogorov)
    if value == float("inf"):
        raise AssertionError("trainc partition: no finite cut (a value the backward needs can "
                             "neither be saved nor recomputed)")
    return frozenset(i for i in range(len(part.nodes)) if (i, 0) in source_side)


def _find(parent: dict, n):
    while parent[n] is not n:
        parent[n] = parent[parent[n]]
        n = parent[n]
    return n


def _union(parent: dict, a, b) -> None:
    ra, rb = _find(parent, a), _find(parent, b)
    if ra is not rb:
        parent[rb] = ra


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
