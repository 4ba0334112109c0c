"""Post-grad reinplacing: functional ops -> in-place / out= forms that write into an input buffer
nobody reads afterwards. The only pass that introduces mutation.

A buffer may be overwritten at node n when every reader of its old value (through any alias of
the same storage) runs before n and no graph output holds the old value. Graph inputs are never
overwritten, except a forward input the program itself mutates (gm.meta[MUTABLE_INPUTS]: name ->
write-back output slot): its new value may be computed straight into its storage. The graph
then returns the input's own buffer in that slot and the runtime's copy-back `input.copy_(new)`
is a no-op (ATen's copy_ returns early when source and destination are the same memory).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.fx as fx

from trainc.passes._graph import (alias_base, is_view, positions, recompiled, same_layout,
                                  schema, written_args)
from trainc.passes._inplace_ops import SCATTER_INPLACE
from trainc.graph import val

aten = torch.ops.aten
MUTABLE_INPUTS = "trainc.mutable_inputs"  # gm.meta key: placeholder name -> write-back slot
REINPLACED = "trainc.reinplaced"  # gm.meta key: ops this pass rewrote
_SCATTERS = {aten.index_put.default, aten.scatter.src, aten.scatter.value,
             aten.scatter_add.default, aten.scatter_reduce.two, *SCATTER_INPLACE}


def reinplace_ops(gm: fx.GraphModule) -> fx.GraphModule:
    mutable = dict(gm.meta.get(MUTABLE_INPUTS, {}))
    pos = positions(gm.graph)
    roots: dict[fx.Node, fx.Node] = {}
    members: dict[fx.Node, list[fx.Node]] = {}
    count = 0
    for node in list(gm.graph.nodes):
        new = _reinplace(gm, node, roots, members, pos, mutable)
        if new is not None:
            pos[new], node, count = pos[node], new, count + 1
        base = alias_base(node)
        roots[node] = roots[base] if base is not None else node
        members.setdefault(roots[node], []).append(node)
    gm.meta[REINPLACED] = gm.meta.get(REINPLACED, 0) + count
    gm.graph.lint()
    recompiled(gm)
    return gm


def _reinplace(gm, node: fx.Node, roots, members, pos, mutable) -> Optional[fx.Node]:
    """Rewrite `node` into a form writing one of its inputs; the new node, or None."""
    for dest, target, kwargs, args in _candidates(node):
        if _can_overwrite(node, dest, roots, members, pos, mutable):
            with gm.graph.inserting_before(node):
                new = gm.graph.call_function(target, args, kwargs)
            new.meta = dict(node.meta)
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            return new
    return None


def _candidates(node: fx.Node):
    """(buffer to write, op, kwargs, args) alternatives for `node`, most preferred first."""
    op = node.target
    if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) \
            or not isinstance(val(node), torch.Tensor) or schema(node).is_mutable:
        return
    pointwise = torch.Tag.pointwise in op.tags
    inplace = None
    if op in _SCATTERS or pointwise:
        inplace = SCATTER_INPLACE.get(op) or _inplace_variant(op)
        if inplace is not None and isinstance(node.args[0], fx.Node):
            yield node.args[0], inplace, dict(node.kwargs), node.args
    out = _out_variant(op) if pointwise else None
    if out is not None:
        for a in dict.fromkeys(x for x in node.args if isinstance(x, fx.Node)):
            if a is not node.args[0] or inplace is None:
                yield a, out, {**node.kwargs, "out": a}, node.args


def _can_overwrite(node, dest, roots, members, pos, mutable) -> bool:
    if not same_layout(val(dest), val(node)) or dest not in roots:
        return False
    root = roots[dest]
    if root.op == "placeholder":
        if root.name not in mutable or not _direct(dest):
            return False
        if not _escapes_only_to(node, mutable[root.name]):
            return False
    elif root.op != "call_function":
        return False
    for a in node.all_input_nodes:
        if a is not dest and roots.get(a) is root:
            return False  # another view of the same buffer would be read while written
    return _no_later_reader(root, node, members, pos)


def _no_later_reader(root: fx.Node, node: fx.Node, members, pos) -> bool:
    """Every reader of `root`'s storage other than `node` runs before `node`."""
    stack, seen = list(members.get(root, [])), set()
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        for u in m.users:
            if u is node:
                continue
            if _views(u, m):
                stack.append(u)  # a view does not read; its users do
            elif u.op == "output" or pos[u] > pos[node]:
                return False
    return True


def _direct(dest: fx.Node) -> bool:
    """`dest` is a graph input or an in-place result chain on one, with no view in between."""
    while dest.op != "placeholder":
        if not written_args(dest):
            return False
        dest = alias_base(dest)
    return True


def _escapes_only_to(node: fx.Node, slot: int) -> bool:
    """Readers of `node`'s value reach the graph output only as output slot `slot` itself."""
    out = node.graph.output_node()
    stack, seen = [node], set()
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        for u in m.users:
            if u is out and any(o is m and k != slot for k, o in enumerate(out.args[0])):
                return False
            if u is not out and _views(u, m):
                if out in u.users:
                    return False  # a view of an input returned as an output
                stack.append(u)
    return True


def _views(u: fx.Node, m: fx.Node) -> bool:
    """`u` is a view of `m` (getitem of an aliasing multi-output op included)."""
    return is_view(u) and (alias_base(u) is m or (bool(u.args) and u.args[0] is m))


@functools.lru_cache(maxsize=None)
def _inplace_variant(op: torch._ops.OpOverload) -> Optional[torch._ops.OpOverload]:
    packet = getattr(torch.ops.aten, op.__name__.split(".")[0] + "_", None)
    overload = getattr(packet, op._overloadname, None) if packet is not None else None
    if overload is None or not _same_args(op._schema.arguments, overload._schema.arguments):
        return None
    return overload


@functools.lru_cache(maxsize=None)
def _out_variant(op: torch._ops.OpOverload) -> Optional[torch._ops.OpOverload]:
    packet = getattr(torch.ops.aten, op.__name__.split(".")[0], None)
    for name in packet.overloads() if packet is not None else ():
        cand = getattr(packet, name)
        args = cand._schema.arguments
        outs = [a for a in args if a.alias_info is not None and a.alias_info.is_write]
        if len(outs) == 1 and outs[0].name == "out" and outs[0].kwarg_only and \
                _same_args(op._schema.arguments, [a for a in args if a is not outs[0]]):
            return cand
    return None


def _same_args(a, b) -> bool:
    return [(x.name, str(x.type)) for x in a] == [(x.name, str(x.type)) for x in b]
