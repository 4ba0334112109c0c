"""as_strided / as_strided_scatter that address a dense tensor's elements in order -> view, slice
and slice_scatter, which the code generators lower (as_strided runs as an ATen fallback).

Decompositions leave them where a reshape went through strides (AdaptiveAvgPool1d's mean viewed
as [N, C, 1, 1] with the pooled dims' strides; its backward scattering the gradient into a
zero buffer). A rewrite applies only when the base is dense in row-major order with no storage
offset (its storage order is its element order) and the strided view is row-major too (strides
of size-1 dims aside): then the view is elements [offset, offset + n) of the flattened base.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.fx as fx

from trainc.graph import val
from trainc.passes._graph import fake_mode, infer_val, recompiled

aten = torch.ops.aten


def as_strided_views(gm: fx.GraphModule) -> fx.GraphModule:
    mode = None
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.as_strided.default,
                                                              aten.as_strided_scatter.default):
            continue
        mode = mode or fake_mode(gm)
        scatter = node.target is aten.as_strided_scatter.default
        base = node.args[0]
        size, stride = node.args[2:4] if scatter else node.args[1:3]
        rest = node.args[4:] if scatter else node.args[3:]
        offset = rest[0] if rest else node.kwargs.get("storage_offset", 0)
        span = _span(val(base), size, stride, offset)
        if span is None:
            continue
        with gm.graph.inserting_before(node):
            new = _scatter(gm.graph, mode, node, span) if scatter else \
                _view(gm.graph, mode, base, list(size), span)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
    recompiled(gm)
    return gm


def _span(base, size, stride, offset) -> Optional[tuple[int, int]]:
    """(start, end) of the flattened base's elements the strided view covers, in order, or
    None where it is not such a run (or any size is symbolic)."""
    if not isinstance(base, torch.Tensor) or not all(
            isinstance(v, int) for v in (*size, *stride, offset, *base.shape, *base.stride())):
        return None
    if base.storage_offset() != 0 or not base.is_contiguous():
        return None
    n = math.prod(size)
    expect = 1
    for d in range(len(size) - 1, -1, -1):
        if size[d] != 1 and stride[d] != expect:
            return None
        expect *= size[d]
    return (offset, offset + n) if 0 <= offset and offset + n <= base.numel() else None


def _call(graph: fx.Graph, mode, target, *args, **kwargs) -> fx.Node:
    n = graph.call_function(target, args, kwargs)
    infer_val(n, mode)
    return n


def _view(graph: fx.Graph, mode, base: fx.Node, size: list, span: tuple[int, int]) -> fx.Node:
    start, end = span
    if start == 0 and end == val(base).numel():
        return _call(graph, mode, aten.view.default, base, size)
    flat = _call(graph, mode, aten.view.default, base, [-1])
    part = _call(graph, mode, aten.slice.Tensor, flat, 0, start, end)
    return _call(graph, mode, aten.view.default, part, size)


def _scatter(graph: fx.Graph, mode, node: fx.Node, span: tuple[int, int]) -> fx.Node:
    base, src = node.args[:2]
    shape = list(val(base).shape)
    # the view's elements in row-major order (remove_noops drops the copy where src is so)
    dense = _call(graph, mode, aten.clone.default, src, memory_format=torch.contiguous_format)
    flat_src = _call(graph, mode, aten.view.default, dense, [-1])
    start, end = span
    if start == 0 and end == val(base).numel():
        return _call(graph, mode, aten.view.default, flat_src, shape)
    flat = _call(graph, mode, aten.view.default, base, [-1])
    out = _call(graph, mode, aten.slice_scatter.default, flat, flat_src, 0, start, end)
    return _call(graph, mode, aten.view.default, out, shape)
