"""Reductions of few outputs over many elements, split in two (Triton): per-channel statistics of
a batch norm reduce 500K elements into each of 128 outputs, one program per output, and leave most
of a GPU idle (or, channels-last, read memory across the grain). Split instead:

    part[s, i] = op over the inner reduced dims of fn(i, (s, ...))   (s: the outermost reduced dim)
    out[i]     = op over s of part[s, i]

Many programs share the first stage, and its loads run along the contiguous dim either way.
Reductions to a scalar are split by the printer instead (triton/split.py); argmax/argmin are not
combinable this way and stay whole. The summation order changes (deterministically).
"""
from __future__ import annotations

import math

import torch

from trainc.codegen import ir
from trainc.codegen.graph import Buffer, ComputeNode, LoweredGraph

SPLIT_MIN_ELEMENTS = 1 << 16  # reduced elements per output, at least
SPLIT_MAX_OUTPUTS = 1 << 13  # outputs, at most (more outputs already fill the machine)
SPLIT_MIN_OUTER = 4  # the outermost reduced dim gives this many partials, at least
SPLIT_OPS = ("sum", "prod", "max", "min")


def split_reductions(g: LoweredGraph) -> LoweredGraph:
    steps = []
    for n in g.steps:
        steps += _split(g, n) if _worth(n) else [n]
    g.steps = steps
    return g


def _worth(n) -> bool:
    return (isinstance(n, ComputeNode) and n.kind == "reduction" and n.reduce_op in SPLIT_OPS
            and len(n.shape) > 0 and len(n.rshape) >= 2 and n.rshape[0] >= SPLIT_MIN_OUTER
            and math.prod(n.shape) <= SPLIT_MAX_OUTPUTS
            and math.prod(n.rshape) >= SPLIT_MIN_ELEMENTS)


def _split(g: LoweredGraph, n: ComputeNode) -> list[ComputeNode]:
    fn, outer = n.fn, n.rshape[0]
    # the partials keep the accumulator's dtype (a bf16 sum's partials are float32)
    dtype = fn(ir.symbols("i", n.shape), ir.symbols("r", n.rshape)).dtype
    if n.reduce_op in ("sum", "prod") and dtype in (torch.bfloat16, torch.float16):
        dtype = torch.float32
    shape = (outer,) + tuple(n.shape)
    name = f"{n.name}_part"
    stride = ir.contiguous_strides(shape)
    g.buffers[name] = Buffer(name, shape, stride, dtype, "compute")
    part = ComputeNode(name, "reduction", shape, dtype,
                       lambda i, r: fn(list(i[1:]), [i[0], *r]), tuple(n.rshape[1:]),
                       n.reduce_op, origins=n.origins, region=n.region)
    whole = ComputeNode(n.name, "reduction", n.shape, n.dtype,
                        lambda i, r: ir.Load(name, ir.linear([r[0], *i], stride), dtype),
                        (outer,), n.reduce_op, origins=n.origins, region=n.region)
    return [part, whole]
