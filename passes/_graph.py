"""Shared facts about FX graphs of ATen ops for the passes: aliasing from op schemas,
allocations, and FakeTensor values for new nodes. Not a pass; no graph is changed here.

A node's storage root is the node whose buffer it lives in: itself for a fresh allocation,
its base's root for a view, the mutated argument's root for an in-place or out= op.
"""
from __future__ import annotations

import operator
from typing import Any, Iterator, Optional

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from trainc.graph import nbytes, val

OpOverload = torch._ops.OpOverload
DEFER_RECOMPILE = "trainc.defer_recompile"  # gm.meta key: set while run_passes runs


def recompiled(gm: fx.GraphModule) -> fx.GraphModule:
    """A pass's changes made runnable (gm.recompile()), except inside run_passes, which
    recompiles once after its last pass: regenerating and compiling a large graph's Python
    after every pass is a visible share of a first call (BENCHMARKS.md)."""
    if not gm.meta.get(DEFER_RECOMPILE):
        gm.recompile()
    return gm


def schema(node: fx.Node) -> Optional[torch.FunctionSchema]:
    if node.op == "call_function" and isinstance(node.target, OpOverload):
        return node.target._schema
    return None


def arg_values(node: fx.Node) -> Iterator[tuple[torch.Argument, Any]]:
    """(schema argument, value given) for every argument of an OpOverload call."""
    s = schema(node)
    if s is None:
        return
    for i, a in enumerate(s.arguments):
        if a.kwarg_only or i >= len(node.args):
            if a.name in node.kwargs:
                yield a, node.kwargs[a.name]
        else:
            yield a, node.args[i]


def written_args(node: fx.Node) -> list[fx.Node]:
    """Nodes whose buffers `node` writes (in-place self, out=), from the schema's `(a!)`."""
    out = []
    for a, v in arg_values(node):
        if a.alias_info is not None and a.alias_info.is_write:
            out.extend(x for x in _flat(v) if isinstance(x, fx.Node))
    return out


def is_mutating(node: fx.Node) -> bool:
    s = schema(node)
    return bool(s is not None and s.is_mutable) or (
        node.op == "call_function" and not isinstance(node.target, OpOverload)
        and getattr(node.target, "__name__", "").endswith("_"))


def alias_base(node: fx.Node) -> Optional[fx.Node]:
    """The node whose storage `node`'s result shares, or None for a fresh buffer."""
    if node.op == "call_function" and node.target is operator.getitem:
        src = node.args[0]
        return alias_base(src) if isinstance(src, fx.Node) and _returns_alias(src) else None
    s = schema(node)
    if s is None or not s.returns or s.returns[0].alias_info is None:
        return None
    sets = s.returns[0].alias_info.before_set
    for a, v in arg_values(node):
        if a.alias_info is not None and (a.alias_info.before_set & sets or _into_list(a, sets)):
            first = next((x for x in _flat(v) if isinstance(x, fx.Node)), None)
            if first is not None:
                return first
    return None


def _into_list(arg, return_sets) -> bool:
    """`Tensor(a -> *) self ... -> Tensor(a)[]` (split, chunk, unbind): the schema gives the
    returned list no alias set of its own; its elements are views of `self`."""
    return not return_sets and "*" in arg.alias_info.after_set and not arg.alias_info.is_write


def is_view(node: fx.Node) -> bool:
    """A non-writing alias: its users read the base's buffer."""
    return alias_base(node) is not None and not written_args(node)


def _returns_alias(node: fx.Node) -> bool:
    s = schema(node)
    return bool(s is not None and s.returns and s.returns[0].alias_info is not None)


def storage_roots(graph: fx.Graph) -> dict[fx.Node, fx.Node]:
    roots: dict[fx.Node, fx.Node] = {}
    for n in graph.nodes:
        base = alias_base(n)
        roots[n] = roots.get(base, base) if base is not None else n
    return roots


def allocates(node: fx.Node) -> bool:
    """Whether `node` produces at least one fresh tensor buffer."""
    if node.op != "call_function" or alias_base(node) is not None:
        return False
    if node.target is operator.getitem:
        return False  # counted on the multi-output op itself
    return nbytes(val(node)) > 0 or _has_tensor(val(node))


def allocation_stats(gm: fx.GraphModule) -> tuple[int, int]:
    """(number of fresh buffers, their bytes) that running `gm` allocates, inputs excluded."""
    count = size = 0
    for n in gm.graph.nodes:
        if allocates(n):
            tensors = [t for t in _flat(val(n)) if isinstance(t, torch.Tensor)]
            count += len(tensors)
            size += sum(nbytes(t) for t in tensors)
    return count, size


def _has_tensor(v: object) -> bool:
    return any(isinstance(t, torch.Tensor) for t in _flat(v))


def _flat(v: object) -> list:
    if isinstance(v, (list, tuple)):
        return [y for x in v for y in _flat(x)]
    return [v]


def output_aliases(graph: fx.Graph) -> set[fx.Node]:
    """Nodes whose buffer a graph output shares (the output nodes and their view bases)."""
    out: set[fx.Node] = set()
    for o in _flat(graph.output_node().args[0]):
        while isinstance(o, fx.Node) and o not in out:
            out.add(o)
            o = alias_base(o)
    return out


def fake_mode(gm: fx.GraphModule) -> FakeTensorMode:
    for n in gm.graph.nodes:
        v = val(n)
        if isinstance(v, FakeTensor):
            return v.fake_mode
    return FakeTensorMode(allow_non_fake_inputs=True)


def infer_val(node: fx.Node, mode: FakeTensorMode) -> Any:
    """Compute and store node.meta["val"] by running the node on its inputs' fake values."""
    args = fx.node.map_arg(node.args, lambda a: val(a))
    kwargs = fx.node.map_arg(node.kwargs, lambda a: val(a))
    with mode:
        v = node.target(*args, **kwargs)
    node.meta["val"] = v
    return v


def positions(graph: fx.Graph) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def same_layout(a: object, b: object) -> bool:
    """Equal shape, strides, dtype and device (storage offset aside)."""
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.stride() == b.stride() and a.dtype == b.dtype and a.device == b.device)
