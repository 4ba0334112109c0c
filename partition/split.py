"""Joint graph + the set of values to save -> (forward graph, backward graph).

Forward: primals -> [fwd outputs] + [saved]. Backward: [saved] + tangents -> grads. Anything the
backward needs that is not saved is recomputed there from saved values; a primal it needs must
be saved. Only this module turns one graph into two.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch.fx as fx

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


def split_joint(joint: JointGraph, saved: Sequence[fx.Node]) -> tuple[fx.GraphModule, fx.GraphModule]:
    fwd_outs, grad_outs = joint_outputs(joint)
    placeholders = [n for n in joint.gm.graph.nodes if n.op == "placeholder"]
    primals = [p for p in placeholders if not p.name.startswith("tangents_")]
    tangents = [p for p in placeholders if p.name.startswith("tangents_")]
    fwd = _extract(joint.gm, primals, list(fwd_outs) + list(saved), stop=set(primals))
    bwd = _extract(joint.gm, list(saved) + tangents, grad_outs, stop=set(saved) | set(tangents))
    return fwd, bwd


def _extract(gm: fx.GraphModule, inputs: list[fx.Node], outputs: Iterable, stop: set) -> fx.GraphModule:
    """A new graph computing `outputs` from `inputs`, copying the nodes in between."""
    outputs = list(outputs)
    needed = _ancestors(outputs, stop)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in inputs:
        env[n] = graph.placeholder(n.name)
        env[n].meta = dict(n.meta)
    for n in gm.graph.nodes:
        if n in needed and n not in env:
            if n.op == "placeholder":
                raise AssertionError(f"trainc partition: {n.name} is needed but neither saved "
                                     "nor an input of this graph")
            env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output([env[o] if isinstance(o, fx.Node) else o for o in outputs])
    graph.lint()
    return fx.GraphModule(gm, graph)


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
