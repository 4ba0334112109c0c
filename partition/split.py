"""Joint graph + the set of values to save -> (forward graph, backward graph).

Forward: primals -> [fwd outputs] + [saved]. Backward: [saved] + tangents -> grads. Anything the
backward needs that is not saved is recomputed there from saved values, each value just before
its first use (so recomputed values are not all live at once); a primal it needs must be saved.
Only this module turns one graph into two.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch.fx as fx
from torch.fx._lazy_graph_module import _make_graph_module

from trainc.graph import JointGraph


def tangent_dependent(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes whose value depends on a tangent: the backward region of the joint graph."""
    dep: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if n.op == "placeholder" and n.name.startswith("tangents_"):
            dep.add(n)
        elif n.op == "call_function" and any(a in dep for a in n.all_input_nodes):
            dep.add(n)
    return dep


def joint_outputs(joint: JointGraph) -> tuple[list, list]:
    """(forward outputs, grad outputs) of the joint graph, as nodes."""
    outs = list(joint.gm.graph.output_node().args[0])
    nf = joint.signature.num_fwd_outputs
    return outs[:nf], outs[nf:]


def inputs_of(joint: JointGraph) -> tuple[list[fx.Node], list[fx.Node]]:
    """(primals incl. the seed, tangents) placeholders of the joint graph."""
    placeholders = [n for n in joint.gm.graph.nodes if n.op == "placeholder"]
    tangents = [p for p in placeholders if p.name.startswith("tangents_")]
    return [p for p in placeholders if p not in tangents], tangents


def execution_order(joint: JointGraph, saved: Sequence[fx.Node]) -> tuple[list, list]:
    """The call_function nodes of the forward and of the backward graph, in execution order."""
    fwd_outs, grad_outs = joint_outputs(joint)
    primals, tangents = inputs_of(joint)
    fwd_needed = _ancestors(list(fwd_outs) + list(saved), set(primals))
    fwd = [n for n in joint.gm.graph.nodes if n in fwd_needed and n.op == "call_function"]
    stop = set(saved) | set(tangents)
    bwd_needed = _ancestors(grad_outs, stop)
    for n in bwd_needed - stop:
        if n.op == "placeholder":
            raise AssertionError(f"trainc partition: {n.name} is needed but neither saved "
                                 "nor an input of this graph")
    bwd = _lazy_order(joint.gm, bwd_needed - stop, tangent_dependent(joint.gm), grad_outs)
    return fwd, bwd


def split_joint(joint: JointGraph,
                saved: Sequence[fx.Node]) -> tuple[fx.GraphModule, fx.GraphModule]:
    fwd_outs, grad_outs = joint_outputs(joint)
    primals, tangents = inputs_of(joint)
    fwd_order, bwd_order = execution_order(joint, saved)
    fwd = _build(joint.gm, primals, fwd_order, list(fwd_outs) + list(saved))
    bwd = _build(joint.gm, list(saved) + tangents, bwd_order, grad_outs)
    return fwd, bwd


def _build(gm: fx.GraphModule, inputs: list, order: list, outputs: Iterable) -> fx.GraphModule:
    """A new graph: placeholders `inputs`, then copies of `order`, returning `outputs`."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in inputs:
        env[n] = graph.placeholder(n.name)
        env[n].meta = dict(n.meta)
    def lookup(a: fx.Node) -> fx.Node:
        if a not in env and a.op == "get_attr":  # tensor constants: copied where used
            env[a] = graph.node_copy(a)
        return env[a]

    for n in order:
        if n not in env:
            env[n] = graph.node_copy(n, lookup)
    graph.output([env[o] if isinstance(o, fx.Node) else o for o in outputs])
    graph.lint()
    # a GraphModule, lazy under _use_lazy_graph_module (a budget's trials: never run, so
    # their Python code is never generated)
    return _make_graph_module(gm, graph)


def _lazy_order(gm: fx.GraphModule, needed: set, anchors: set, outputs: list) -> list:
    """Backward nodes in joint order; each recomputed node is pulled in just before its first
    user, so recomputation interleaves with the backward instead of preceding it."""
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    done: set[fx.Node] = set()
    order: list[fx.Node] = []

    def pull(node: fx.Node) -> None:
        pending, work = set(), [a for a in node.all_input_nodes if a in needed]
        while work:
            m = work.pop()
            if m in done or m in pending:
                continue
            pending.add(m)
            work.extend(a for a in m.all_input_nodes if a in needed)
        for m in sorted(pending, key=index.__getitem__):
            done.add(m)
            order.append(m)

    for n in gm.graph.nodes:
        if n in needed and n in anchors and n not in done:
            pull(n)
            done.add(n)
            order.append(n)
    for o in outputs:
        if isinstance(o, fx.Node) and o in needed and o not in done:
            pull(o)
            done.add(o)
            order.append(o)
    return order


def _ancestors(outputs: list, stop: set) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    work = [o for o in outputs if isinstance(o, fx.Node)]
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        if n not in stop:
            work.extend(n.all_input_nodes)
    return seen
