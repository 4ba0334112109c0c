"""Evaluate scalar and shape arithmetic whose inputs are all constants at compile time.

Folded: Python-number ops (operator.*) and one-element tensor ops from an exactly rounded
whitelist (IEEE + - * / sqrt, comparisons, casts, where, ...), so a folded value is bitwise what
the device would compute. A one-element tensor becomes `aten.full(shape, value)`; a number
replaces its uses directly. Large constant tensors are left alone (no baked-in buffers).
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from trainc.graph import val
from trainc.passes._graph import recompiled

aten = torch.ops.aten
_CREATE = {aten.scalar_tensor.default, aten.full.default, aten.zeros.default,
           aten.ones.default}
_EXACT = {
    aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.mul.Tensor,
    aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.neg.default, aten.abs.default,
    aten.sqrt.default, aten.reciprocal.default, aten.maximum.default, aten.minimum.default,
    aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar, aten.lt.Tensor,
    aten.lt.Scalar, aten.le.Tensor, aten.le.Scalar, aten.gt.Tensor, aten.gt.Scalar,
    aten.ge.Tensor, aten.ge.Scalar, aten.where.self, aten.logical_not.default,
    aten.logical_and.default, aten.logical_or.default, aten.bitwise_not.default,
    aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten._to_copy.default, aten.clone.default,
    aten.lift_fresh_copy.default, aten.view.default, aten.reshape.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.expand.default,
    aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default,
}
_PY_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
           operator.neg, operator.mod, operator.pow, operator.eq, operator.ne, operator.lt,
           operator.le, operator.gt, operator.ge}


def fold_constants(gm: fx.GraphModule) -> fx.GraphModule:
    consts: dict[fx.Node, Any] = {}
    for node in list(gm.graph.nodes):
        value = _evaluate(gm, node, consts)
        if value is None:
            continue
        consts[node] = value
        if isinstance(value, torch.Tensor) and node.target not in _CREATE \
                and node.op != "get_attr":
            consts[_replace_with_full(gm, node, value)] = value
        elif not isinstance(value, torch.Tensor):
            node.replace_all_uses_with(value)  # a Python number: inline the literal
    gm.graph.eliminate_dead_code()
    recompiled(gm)
    return gm


def _evaluate(gm: fx.GraphModule, node: fx.Node, consts: dict) -> Any:
    """The concrete value of `node` if it is a small constant we fold exactly, else None."""
    if node.op == "get_attr":
        v = getattr(gm, node.target, None)
        return v if isinstance(v, torch.Tensor) and v.numel() == 1 else None
    if node.op != "call_function":
        return None
    py = node.target in _PY_OPS
    if not py and node.target not in _EXACT | _CREATE:
        return None
    small = isinstance(val(node), torch.Tensor) and val(node).numel() == 1 \
        and not val(node).is_complex()
    if not (py or small) or any(a not in consts for a in node.all_input_nodes):
        return None
    args = fx.node.map_arg(node.args, lambda a: consts[a])
    kwargs = fx.node.map_arg(node.kwargs, lambda a: consts[a])
    try:
        out = node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - anything we cannot evaluate is simply not folded
        return None
    if py:
        return out if type(out) in (int, float, bool) else None
    want = val(node)
    if not isinstance(out, torch.Tensor) or out.dtype != want.dtype or out.shape != want.shape:
        return None
    return out


def _replace_with_full(gm: fx.GraphModule, node: fx.Node, value: torch.Tensor) -> fx.Node:
    want = val(node)
    if torch.empty(want.shape).stride() != want.stride():
        return node  # keep exotic layouts of size-1 tensors as they are
    with gm.graph.inserting_before(node):
        full = gm.graph.call_function(aten.full.default, (list(want.shape), value.item()), {
            "dtype": want.dtype, "layout": torch.strided, "device": want.device,
            "pin_memory": False})
    full.meta = dict(node.meta)
    node.replace_all_uses_with(full)
    gm.graph.erase_node(node)
    return full
