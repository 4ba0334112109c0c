"""Pad 16-bit CUDA matmuls whose sizes are not multiples of 8 -> the same products, aligned.

cuBLAS runs bf16/fp16 GEMMs with a leading dimension that is not a multiple of 8 elements on a
slow path (GPT-2's 50257-word LM head and its gradients). Zero-padded operands give the same
products in the kept rows and columns; the result is a slice of the padded one.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from trainc.passes._graph import recompiled

aten = torch.ops.aten
ALIGN = 8  # elements: 16 bytes of bf16/fp16
MIN_FLOPS = 1 << 30  # smaller products: the pad copies would cost more than they save
_MATMULS = (aten.mm.default, aten.bmm.default)
DEVICES = ("cuda",)  # where the slow path exists (tests add "cpu" to run it through a backend)


def pad_matmuls(gm: fx.GraphModule, devices: tuple[str, ...] = ()) -> fx.GraphModule:
    devices = devices or DEVICES
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _MATMULS and \
                _worth(node, devices):
            _pad(gm.graph, node)
    recompiled(gm)
    return gm


def _worth(node: fx.Node, devices) -> bool:
    a, b = (x.meta.get("val") for x in node.args[:2])
    if not all(isinstance(v, torch.Tensor) for v in (a, b)):
        return False
    if a.dtype not in (torch.bfloat16, torch.float16) or a.device.type not in devices:
        return False
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    flops = 2 * math.prod(a.shape[:-2]) * m * k * n
    return flops >= MIN_FLOPS and any(d % ALIGN for d in (m, k, n))


def _pad(graph: fx.Graph, node: fx.Node) -> None:
    a, b = node.args[:2]
    m, k, n = a.meta["val"].shape[-2], a.meta["val"].shape[-1], b.meta["val"].shape[-1]
    pm, pk, pn = ((-d) % ALIGN for d in (m, k, n))
    with graph.inserting_before(node):
        a2 = _call(graph, aten.constant_pad_nd.default, (a, [0, pk, 0, pm])) if pk or pm else a
        b2 = _call(graph, aten.constant_pad_nd.default, (b, [0, pn, 0, pk])) if pk or pn else b
        out = _call(graph, node.target, (a2, b2))
        if pm:
            out = _call(graph, aten.slice.Tensor, (out, -2, 0, m))
        if pn:
            out = _call(graph, aten.slice.Tensor, (out, -1, 0, n))
    out.meta.update({k: v for k, v in node.meta.items() if k != "val"})
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def _call(graph: fx.Graph, target, args: tuple) -> fx.Node:
    """A new node with its FakeTensor value computed from its arguments' values."""
    node = graph.call_function(target, args)
    vals = tuple(a.meta["val"] if isinstance(a, fx.Node) else a for a in args)
    node.meta["val"] = target(*vals)
    return node
