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
    padded: dict = {}  # (tensor, pads) -> its padded copy, shared by the matmuls reading it
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _MATMULS and \
                _worth(node, devices):
            _pad(gm.graph, node, padded)
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


def _pad(graph: fx.Graph, node: fx.Node, padded: dict) -> None:
    a, b = node.args[:2]
    m, k, n = a.meta["val"].shape[-2], a.meta["val"].shape[-1], b.meta["val"].shape[-1]
    pm, pk, pn = ((-d) % ALIGN for d in (m, k, n))
    with graph.inserting_before(node):
        a2 = _padded(graph, a, pk, pm, padded) if pk or pm else a
        b2 = _padded(graph, b, pn, pk, padded) if pk or pn else b
        out = _call(graph, node.target, (a2, b2))
        if pm:
            out = _call(graph, aten.slice.Tensor, (out, -2, 0, m))
        if pn:
            out = _call(graph, aten.slice.Tensor, (out, -1, 0, n))
    out.meta.update({k: v for k, v in node.meta.items() if k != "val"})
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def _padded(graph: fx.Graph, x: fx.Node, cols: int, rows: int, padded: dict) -> fx.Node:
    """x with `cols` zero columns and `rows` zero rows appended. A transposed x pads the tensor
    it transposes, then transposes that: the copy keeps the tensor's own layout (a transposing
    copy of GPT-2's [8192, 50257] logits gradient took 2.9 ms on the H200), and the matmul
    reading the tensor itself shares the same padded copy."""
    base = _transposed(x)
    if base is not None:
        nd = x.meta["val"].dim()
        return _call(graph, aten.permute.default,
                     (_padded(graph, base, rows, cols, padded), [*range(nd - 2), nd - 1, nd - 2]))
    key = x, cols, rows
    if key not in padded:
        padded[key] = _call(graph, aten.constant_pad_nd.default, (x, [0, cols, 0, rows]))
    return padded[key]


def _transposed(x: fx.Node) -> "fx.Node | None":
    """The tensor x swaps the last two dims of, if x is such a transpose."""
    if x.op != "call_function":
        return None
    nd = x.meta["val"].dim()
    if x.target is aten.t.default:
        return x.args[0]
    if x.target is aten.transpose.int and {d % nd for d in x.args[1:3]} == {nd - 2, nd - 1}:
        return x.args[0]
    if x.target is aten.permute.default and \
            list(x.args[1]) == [*range(nd - 2), nd - 1, nd - 2]:
        return x.args[0]
    return None


def _call(graph: fx.Graph, target, args: tuple) -> fx.Node:
    """A new node with its FakeTensor value computed from its arguments' values."""
    node = graph.call_function(target, args)
    vals = tuple(a.meta["val"] if isinstance(a, fx.Node) else a for a in args)
    node.meta["val"] = target(*vals)
    return node
