"""In-place and out= ATen ops -> their functional forms, for lowering: codegen wants the
dataflow; graph.py keeps "this result may live in the written buffer" as a hint that
codegen/memory/inplace.py re-checks after fusion, so the mutation itself is not lost.

A write through a view of a graph input, or of a value read later, is refused with a clear error.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.fx as fx

aten = torch.ops.aten

_SPECIAL = {"slice_scatter_": aten.slice_scatter.default,
            "select_scatter_": aten.select_scatter.default}


def written(node: fx.Node) -> list[tuple[int | str, fx.Node]]:
    """(position or kwarg name, node) of each argument the op writes."""
    s = getattr(node.target, "_schema", None)
    if s is None:
        return []
    out = []
    for i, a in enumerate(s.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = node.kwargs.get(a.name) if (a.kwarg_only or i >= len(node.args)) else node.args[i]
        key = a.name if (a.kwarg_only or i >= len(node.args)) else i
        if isinstance(v, fx.Node):
            out.append((key, v))
    return out


@functools.lru_cache(maxsize=None)
def functional_variant(op: torch._ops.OpOverload) -> Optional[torch._ops.OpOverload]:
    """add_.Tensor -> add.Tensor, mul.out -> mul.Tensor, where.self_out -> where.self."""
    name = op.overloadpacket.__name__
    if name in _SPECIAL:
        return _SPECIAL[name]
    if name.endswith("_") and not name.startswith("_"):
        packet = getattr(aten, name[:-1], None)
        return getattr(packet, op._overloadname, None) if packet is not None else None
    args = [a for a in op._schema.arguments if not (a.alias_info and a.alias_info.is_write)]
    sig = [(a.name, str(a.type)) for a in args]
    for ov in op.overloadpacket.overloads():
        cand = getattr(op.overloadpacket, ov)
        if cand is op:
            continue
        cargs = cand._schema.arguments
        if [(a.name, str(a.type)) for a in cargs] == sig and \
                not any(a.alias_info and a.alias_info.is_write for a in cargs):
            return cand
    return None


VIEW_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default,
             aten.permute.default, aten.expand.default, aten.slice.Tensor, aten.select.int,
             aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default,
             aten.t.default, aten.transpose.int, aten.alias.default, aten.as_strided.default,
             aten.diagonal.default, aten.split_with_sizes.default, aten.split.Tensor}


def check_write(node: fx.Node, dest: fx.Node) -> None:
    """Refuse writes whose effect a functional rewrite would lose."""
    base = dest
    while base.op == "call_function" and (base.target in VIEW_OPS or _split_item(base)):
        base = base.args[0]
    if base is dest:
        return
    # nodes compare by their position in the graph (no per-write numbering of the whole graph)
    if base.op == "placeholder" or any(u > node for u in base.users):
        raise NotImplementedError(
            f"trainc cpp: {node.name} ({node.target}) writes through a view of {base.name}, "
            "which is read afterwards; use backend='aten' for this graph")


def _split_item(node: fx.Node) -> bool:
    """getitem of a split: a view of the split's input (other getitems are separate tensors)."""
    src = node.args[0] if node.args else None
    return getattr(node.target, "__name__", "") == "getitem" and isinstance(src, fx.Node) and \
        src.target in VIEW_OPS
