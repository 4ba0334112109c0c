"""Whole-step graph (compile_step) + memory budget -> the same graph with recomputation inside it.

Backward region = nodes that depend on the `tangents_0` placeholder (backward and optimizer
update). The min-cut partitioner picks which forward values the backward keeps; the others are
computed again right before their first backward use, so their forward copies die early.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch.fx as fx

from trainc.config import Config
from trainc.graph import OFFLOAD_NODE, GraphSignature, JointGraph
from trainc.partition import Partition, build_partition, generates_kernels
from trainc.partition import budget as B
from trainc.partition import policy as P
from trainc.partition.cost import CostModel
from trainc.partition.mincut_choose import OBJECTIVES
from trainc.partition.policy import DEFAULT_POLICY
from trainc.partition.refine import refined
from trainc.partition.save_all import save_all_nodes
from trainc.partition.split import tangent_dependent

# node.meta[REGION] on a rewritten step graph: FORWARD, or BACKWARD + k for the k-th stretch of
# the backward (backward, optimizer update and recomputed copies), a new stretch starting at each
# run of recomputed copies under a memory budget (without one, the backward is one stretch).
# Code generators must not fuse across regions: a recomputed copy fused into an earlier kernel
# (forward or backward) would be computed early and kept alive, undoing the budget; inside a
# stretch it still fuses with the backward nodes that read it.
REGION = "trainc_region"
FORWARD, BACKWARD = 0, 1
PLANS = "trainc_step_plans"  # gm.meta: candidate plans of a step graph, per save policy


def recompute_in_step(gm: fx.GraphModule, config: Config,
                      predict: Optional[Callable[[fx.GraphModule], int]] = None
                      ) -> tuple[fx.GraphModule, Partition]:
    """Partition the step graph as if forward and backward were two graphs, then stitch them
    back into one: forward, then backward with its recomputation interleaved (split.py's
    order). Outputs keep their order; the simulated peak is the partition's. `predict` (the
    step's, where the backend makes memory plans: a stitched step graph -> its wrapper's
    planned peak) makes a budget read against predicted peaks, as trainc.compile's does."""
    out = gm.graph.output_node()
    outs = list(out.args[0])
    backward = tangent_dependent(gm)
    fwd_idx = [i for i, o in enumerate(outs) if not (isinstance(o, fx.Node) and o in backward)]
    bwd_idx = [i for i, o in enumerate(outs) if i not in fwd_idx]
    # partition() reads the joint layout "[forward outputs] + [grads]": reorder for its duration.
    out.args = ([outs[i] for i in fwd_idx] + [outs[i] for i in bwd_idx],)
    try:
        sig = GraphSignature((), (), len(fwd_idx), (), (), (), True)
        predict_part = None if predict is None else _Stitched(
            predict, lambda part: _stitch(gm, part, fwd_idx, bwd_idx, True))
        part = _partition(JointGraph(gm, sig), config, [outs[i] for i in fwd_idx], backward,
                          predict_part)
    finally:
        out.args = (outs,)
    return _stitch(gm, part, fwd_idx, bwd_idx, config.memory_budget is not None), part


class _Stitched:
    """A predictor of stitched step graphs as one of partitions (its offload methods too)."""

    def __init__(self, predict, stitch):
        self.predict, self.stitch = predict, stitch
        if hasattr(predict, "offload"):
            self.base = lambda part: predict.base(stitch(part))
            self.offload = lambda part, cap: predict.offload(stitch(part), cap)

    def __call__(self, part: Partition) -> int:
        return self.predict(self.stitch(part))


def _partition(joint: JointGraph, config: Config, fwd_outs: list, backward: set,
               predict: Optional[Callable[[Partition], int]] = None) -> Partition:
    """Without a budget, the min-cut's default plan (mincut_choose.OBJECTIVES) under the step's
    costs. With one, the budget search of mincut_choose, over candidates from two cost models
    (the policy's, and the step's, where backward-only values are free): each sweep alone finds
    few plans, and the lowest peaks come from either. Every plan is scored under the step's
    costs."""
    policy = config.policy or DEFAULT_POLICY
    fuses = generates_kernels(config)
    # bytes unless asked: "balanced" (trainc.compile's cpp default without convolutions)
    # planned a larger peak than saving everything on the mlp step
    name = config.partition_objective or "bytes"
    objective = OBJECTIVES[name]
    if config.memory_budget is None:  # the default plan: no sweep over budgets
        costs = _step_costs(joint.gm, policy, fwd_outs, backward, fuses)
        return build_partition(joint, costs, objective(joint, costs), "default", None)
    cache = joint.gm.meta.setdefault(PLANS, {})  # one sweep per graph, policy, objective, backend
    if (policy, name, fuses) not in cache:
        step_costs = _step_costs(joint.gm, policy, fwd_outs, backward, fuses)
        default = B.evaluate(joint, step_costs, objective(joint, step_costs), "default")
        save_all = B.evaluate(joint, step_costs, save_all_nodes(joint), "save_all")
        plans = {p.saved: p for p in B.candidates(joint, step_costs, [save_all, default])}
        for p in B.candidates(joint, CostModel(joint.gm, policy, fuses)):
            if p.saved not in plans:
                plans[p.saved] = B.evaluate(joint, step_costs, p.saved,
                                            p.label + " (policy costs)")
        cache[policy, name, fuses] = step_costs, default, refined(joint, step_costs,
                                                                  list(plans.values()))
    step_costs, default, plans = cache[policy, name, fuses]
    graph_name = f"a training step of {len(joint.gm.graph.nodes)} nodes"
    moved: tuple = ()
    if predict is not None:
        best, note, moved = _by_prediction(joint, step_costs, default, plans, config,
                                           graph_name, predict)
    else:
        best, note = B.choose(plans, default, config.memory_budget, B.fixed_bytes(step_costs),
                              graph_name)
    return build_partition(joint, step_costs, list(best.saved), "budget", note, offload=moved)


def _by_prediction(joint: JointGraph, costs: CostModel, default: B.Plan, plans: list,
                   config: Config, graph_name: str, predict) -> tuple:
    """The least-recompute plan whose predicted step peak (the stitched step's memory plan)
    fits the budget's cap, read against predicted peaks (budget.predicted_cap); and the saved
    values it moves to host where `predict` can move them (trainc/offloading.StepOffload: a
    plan's peak is then the one with the most moved, the default plan's with none)."""
    rungs = B.ladder(plans, default)
    part = lambda p: build_partition(joint, costs, list(p.saved), "budget", None,  # noqa: E731
                                     observe=False)
    preds = B.Predictions(lambda p: predict(part(p)))
    base = getattr(predict, "base", None)
    default_peak, low = (base(part(default)) if base else preds(default)), preds(rungs[0])
    cap, note = B.predicted_cap(config.memory_budget, default_peak, low, B.fixed_bytes(costs),
                                graph_name)
    if cap is None:
        return default, note, ()
    best = B.last_under(rungs, preds, cap)  # the leanest rung fits: cap >= low
    moves = getattr(predict, "offload", None)
    moved, chosen = moves(part(best), cap) if moves else ((), preds(best))
    note = B.predicted_note(cap, default_peak, low, chosen, len(preds.peaks))
    return best, note + (f"; {len(moved)} saved values moved to host memory" if moves else ""), \
        moved


def _step_costs(gm: fx.GraphModule, policy: P.SavePolicy, fwd_outs: list,
                backward: set, fuses: bool) -> CostModel:
    """The policy's costs, except that values no forward output needs (autograd's backward
    formulas that read only forward values, optimizer scalars) cost nothing to recompute: the
    traced step computes them in the backward anyway, so "recomputing" them adds no work."""
    costs = CostModel(gm, policy, fuses)
    needed: set[fx.Node] = set()
    work = [o for o in fwd_outs if isinstance(o, fx.Node)]
    while work:
        n = work.pop()
        if n not in needed:
            needed.add(n)
            work.extend(n.all_input_nodes)
    for n, c in costs.costs.items():
        if n.op == "call_function" and n not in backward and n not in needed \
                and c.cls not in (P.NEVER, P.INPUT):
            costs.costs[n] = dataclasses.replace(c, flops=0, recompute=0)
    return costs


def _stitch(gm: fx.GraphModule, part: Partition, fwd_idx: list[int],
            bwd_idx: list[int], stretches: bool = True) -> fx.GraphModule:
    """`stretches` (under a budget): a new backward region at each run of recomputed copies.
    Without a budget the backward is one region: recomputed copies may then join any backward
    kernel. Measured on scaled copies (triton, bf16; kernels / MB moved / planned peak MiB):
    mlp stretches 91 / 260 / 25.0, one region 62 / 228 / 26.5, save_all 57 / 228 / 45.0; gpt
    75 / 24.6 / 2.25, 52 / 22.1 / 2.38, 51 / 22.5 / 2.95."""
    graph = fx.Graph()
    inputs: dict[str, fx.Node] = {}
    for p in gm.graph.nodes:
        if p.op == "placeholder":
            inputs[p.name] = graph.placeholder(p.name)
            inputs[p.name].meta = dict(p.meta)
    fwd_out = _inline(graph, part.fwd, lambda i, p: inputs[p.name], FORWARD)
    n_fwd = len(fwd_idx)
    saved = fwd_out[n_fwd:]
    for name, node in zip(part.saved, saved):  # what an offload request may move (by name)
        if isinstance(node, fx.Node):
            node.meta[OFFLOAD_NODE] = name
    bwd_out = _inline(graph, part.bwd,
                      lambda i, p: saved[i] if i < len(saved) else inputs[p.name], BACKWARD,
                      stretches)
    final: list = [None] * (len(fwd_idx) + len(bwd_idx))
    for k, i in enumerate(fwd_idx):
        final[i] = fwd_out[k]
    for k, i in enumerate(bwd_idx):
        final[i] = bwd_out[k]
    graph.output(final)
    graph.lint()
    new = fx.GraphModule(gm, graph)
    new.meta.update({k: v for k, v in gm.meta.items() if k not in (PLANS, "trainc_budget_plans")})
    return new


def _inline(graph: fx.Graph, sub: fx.GraphModule, placeholder, region: int,
            stretches: bool = True) -> list:
    """Copy `sub`'s nodes into `graph` (names made unique: recomputed copies of forward values
    get new names), tagged with `region`; `placeholder(i, node)` gives the value of its i-th
    input. Returns the outputs."""
    env: dict[fx.Node, fx.Node] = {}
    i = 0
    regions = _stretches(sub) if region == BACKWARD and stretches else {}
    for n in sub.graph.nodes:
        if n.op == "placeholder":
            env[n] = placeholder(i, n)
            i += 1
        elif n.op == "output":
            return [env[a] if isinstance(a, fx.Node) else a for a in n.args[0]]
        else:
            env[n] = graph.node_copy(n, lambda a: env[a])
            env[n].meta[REGION] = regions.get(n, region)
    raise AssertionError("trainc: a partitioned graph without an output node")


def _stretches(bwd: fx.GraphModule) -> dict[fx.Node, int]:
    """Region of each backward node: BACKWARD + the number of recomputation runs before it
    (a run: consecutive nodes that do not depend on the tangent, i.e. recomputed copies)."""
    out: dict[fx.Node, int] = {}
    backward = tangent_dependent(bwd)
    k, prev_copy = BACKWARD - 1, False
    for n in bwd.graph.nodes:
        if n.op != "call_function":
            continue
        copy = n not in backward
        if copy and not prev_copy or k < BACKWARD:
            k += 1
        out[n], prev_copy = k, copy
    return out
