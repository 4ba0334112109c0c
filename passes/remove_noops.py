"""Remove ops that return their input's value unchanged and collapse view/permute chains.

x*1, x/1, x-0, x+(-0.0) (x+0 only for integers: -0.0+0 is +0.0), to()/_to_copy/clone/expand/
copy that keep the layout, view(view(x)), permute(permute(x)). A node is only replaced by
another value when the layouts match and no graph output aliases it (outputs keep their own
buffers), so the graph computes bit-identical values.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.fx as fx

from trainc.passes._graph import (alias_base, fake_mode, output_aliases, recompiled,
                                  same_layout, storage_roots)
from trainc.graph import val

aten = torch.ops.aten
_MUL_DIV = {aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar}
_ADD = {aten.add.Tensor, aten.add.Scalar}
_SUB = {aten.sub.Tensor, aten.sub.Scalar}
_COPIES = {aten._to_copy.default, aten.clone.default, aten.expand.default}
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}


def remove_noops(gm: fx.GraphModule) -> fx.GraphModule:
    protected, roots = output_aliases(gm.graph), storage_roots(gm.graph)
    mode = fake_mode(gm)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        _collapse_chain(node, mode)
        same = _identity_of(node)
        if same is None or not same_layout(val(node), val(same)) or roots[same].op == "get_attr":
            continue  # constants stay behind their copy: nothing may alias a module attribute
        if node in protected:
            # An output may take over `same`'s buffer only if no input or other output has it.
            chain = _alias_chain(same)
            if roots[same].op != "call_function" or chain & protected:
                continue
            protected |= chain
        node.replace_all_uses_with(same)
        gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    recompiled(gm)
    return gm


def _alias_chain(node: fx.Node) -> set[fx.Node]:
    chain = set()
    while node is not None:
        chain.add(node)
        node = alias_base(node)
    return chain


def _identity_of(node: fx.Node) -> Optional[fx.Node]:
    """The input node `node` equals bitwise, or None."""
    t, args = node.target, node.args
    x = args[0] if args and isinstance(args[0], fx.Node) else None
    if x is None:
        return None
    if t in _COPIES:
        return x
    if t is aten.copy.default and isinstance(args[1], fx.Node):
        return args[1]  # layout equality with `node` (self's layout) is checked by the caller
    if t in _VIEWS or t is aten.permute.default:
        return x  # an identity view: same shape and strides, checked by the caller
    if len(args) < 2 or isinstance(args[1], fx.Node) or node.kwargs.get("alpha", 1) != 1:
        return None
    other = args[1]
    if not isinstance(other, (int, float)) or isinstance(other, bool):
        return None
    if t in _MUL_DIV and other == 1:
        return x
    integral = not val(x).is_floating_point() if isinstance(val(x), torch.Tensor) else False
    if t in _ADD and other == 0 and (integral or math.copysign(1.0, other) < 0):
        return x
    if t in _SUB and other == 0 and (integral or math.copysign(1.0, other) > 0):
        return x
    return None


def _collapse_chain(node: fx.Node, mode) -> None:
    """view(view(x, a), b) -> view(x, b); permute(permute(x, p), q) -> permute(x, p[q])."""
    if node.target in _VIEWS:
        inner = node.args[0]
        while isinstance(inner, fx.Node) and inner.target in _VIEWS:
            if not _viewable(val(inner.args[0]), node.args[1], val(node), mode):
                return
            node.args = (inner.args[0], node.args[1])
            inner = inner.args[0]
    elif node.target is aten.permute.default:
        inner = node.args[0]
        while isinstance(inner, fx.Node) and inner.target is aten.permute.default:
            p, q = list(inner.args[1]), list(node.args[1])
            node.args = (inner.args[0], [p[i % len(p)] for i in q])
            inner = inner.args[0]


def _viewable(base, shape, want, mode) -> bool:
    """Whether aten.view(base, shape) exists and lays out as `want` (view composition check)."""
    if not isinstance(base, torch.Tensor):
        return False
    try:
        with mode:
            got = aten.view.default(base, shape)
    except RuntimeError:
        return False
    return same_layout(got, want)
