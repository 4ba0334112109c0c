"""Merge call_function nodes with the same target and arguments into the first one.

Never merged: random ops (trainc.philox_uniform, ops tagged nondeterministic_seeded), ops that
mutate or have side effects, and anything that is not an ATen/trainc op or operator.getitem.
"""
from __future__ import annotations

import operator
from typing import Any, Hashable

import torch
import torch.fx as fx

from trainc.passes._graph import is_mutating, recompiled


def eliminate_common_subexpressions(gm: fx.GraphModule) -> fx.GraphModule:
    seen: dict[Hashable, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if not _mergeable(node):
            continue
        try:
            key = (node.target, _key(node.args), _key(node.kwargs))
            hash(key)
        except TypeError:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            gm.graph.erase_node(node)
    recompiled(gm)
    return gm


def _mergeable(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    if not isinstance(node.target, torch._ops.OpOverload) or is_mutating(node):
        return False
    if node.target.namespace == "trainc" and "philox" in node.target.__name__:
        return False  # two draws are two random streams even if their arguments were equal
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded not in tags and \
        torch.Tag.nondeterministic_bitwise not in tags and not node.meta.get("nondeterministic")


def _key(a: Any) -> Hashable:
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_key(x) for x in a))
    if isinstance(a, dict):
        return tuple(sorted((k, _key(v)) for k, v in a.items()))
    if isinstance(a, fx.Node):
        return ("node", a)
    if isinstance(a, float):
        return ("float", a, str(a))  # keeps -0.0 apart from 0.0 and nan comparable
    return (type(a).__name__, a)
