"""Reductions of few outputs over many elements, split in two (Triton): per-channel statistics of
a batch norm reduce 500K elements into each of 128 outputs, one program per output, and leave most
of a GPU idle (or, channels-last, read memory across the grain). Split instead:

    part[s, i] = op over the inner reduced dims of fn(i, (s, ...))   (s: the outermost reduced dim)
    out[i]     = op over s of part[s, i]

Many programs share the first stage, and its loads run along the contiguous dim either way.
Reductions to a scalar are split by the printer instead (triton/split.py); argmax/argmin are not
combinable this way and stay whole. The summation order changes (deterministically).

A variance after its mean (`sum((x - sum(x) / N) ** 2)`, the two passes of reductions._mean_var)
splits the parallel way (Chan et al.): each part centers on its own (rounded) mean c[s, i] =
sum_part[s, i] / n, and the exact identity
    sum (x - mu) ** 2 = sum (x - c) ** 2 + 2 (c - mu) sum (x - c) + n (c - mu) ** 2
combines the parts: the middle term is what a rounded c leaves behind (without it: 10-20x the
two-pass error, for data far from 0). The partials come from one kernel (its second loop
re-reads a chunk the first just read) and the totals from one more: 2 kernels where the
two-pass split took 4, and no read of x waits for the global mean.
"""
from __future__ import annotations

import dataclasses
import math

import sympy
import torch

from trainc.codegen import ir
from trainc.codegen.graph import Buffer, ComputeNode, LoweredGraph

SPLIT_MIN_ELEMENTS = 1 << 16  # reduced elements per output, at least
SPLIT_MAX_OUTPUTS = 1 << 13  # outputs, at most (more outputs already fill the machine)
SPLIT_MIN_OUTER = 4  # the outermost reduced dim gives this many partials, at least
SPLIT_OPS = ("sum", "prod", "max", "min")


def split_reductions(g: LoweredGraph) -> LoweredGraph:
    steps, split = [], {}
    for n in g.steps:
        m = next((m for m in (n, _as_two_dims(n)) if _worth(m)), None)
        if m is None and _columns(n, g) and \
                math.prod(n.shape) * math.prod(n.rshape) >= COLUMN_MIN_TOTAL:
            # n itself when its last dim does not divide: then its first reduced dim is the parts
            m = _in_parts(n, COLUMN_PARTS, COLUMN_MIN_PART)
            m = m if _worth(m, COLUMN_MIN_ELEMENTS) else None
        if m is None:
            steps.append(n)
            continue
        m = _finer_columns(m, g)
        parts = _split_variance(g, m, split)
        steps += parts if parts is not None else _split(g, m)
        split[m.name] = m
    g.steps = steps
    return g


def _worth(n, min_elements: "int | None" = None) -> bool:
    min_elements = SPLIT_MIN_ELEMENTS if min_elements is None else min_elements
    return (isinstance(n, ComputeNode) and n.kind == "reduction" and n.reduce_op in SPLIT_OPS
            and len(n.shape) > 0 and len(n.rshape) >= 2 and n.rshape[0] >= SPLIT_MIN_OUTER
            and math.prod(n.shape) <= SPLIT_MAX_OUTPUTS
            and math.prod(n.rshape) >= min_elements)


SPLIT_ONE_DIM_PARTS = 64  # a single reduced dim is cut into at most this many parts ...
SPLIT_ONE_DIM_MIN_PART = 1024  # ... of at least this many elements
# Column reductions (loads strided along the reduced rows) split from fewer rows: the Llama's
# RMSNorm weight gradients (8192 token rows into each of 2048 columns) ran looped, one program
# per few columns, at about 28% of the H200's bandwidth.
COLUMN_PARTS = 16
COLUMN_MIN_PART = 512  # reduced elements of a part, at least
COLUMN_MIN_ELEMENTS = 2048  # reduced elements per output, at least
COLUMN_MIN_TOTAL = 1 << 20  # elements in all (below that, one launch is cheaper)


def _as_two_dims(n):
    """A reduction over one long dim (normact's LayerNorm weight and bias gradients: 65536
    rows into each of 4096 columns) as the same reduction over (parts, rows per part), so
    _split can spread it (split_reductions uses it where _worth says so). Other nodes are
    returned as they are."""
    if not (isinstance(n, ComputeNode) and n.kind == "reduction" and len(n.rshape) == 1):
        return n
    return _in_parts(n, SPLIT_ONE_DIM_PARTS, SPLIT_ONE_DIM_MIN_PART)


def _in_parts(n: ComputeNode, most: int, least: int) -> ComputeNode:
    """n with its last reduced dim cut in at most `most` parts moved to the front:
    r_last = s * k + r', each part reducing at least `least` elements; n itself when the dim
    does not divide so."""
    total, parts, rest = n.rshape[-1], most, math.prod(n.rshape[:-1])
    while parts >= SPLIT_MIN_OUTER and (total % parts or rest * (total // parts) < least):
        parts //= 2
    if parts < SPLIT_MIN_OUTER:
        return n
    k, fn = total // parts, n.fn
    return dataclasses.replace(n, rshape=(parts, *n.rshape[:-1], k),
                               fn=lambda i, r: fn(i, [*r[1:-1], r[0] * k + r[-1]]))


# Channels-last statistics (a batch norm's sums over N, H, W per channel, C contiguous) split
# on N alone gave parts of a whole image each, reduced one program per few channels across the
# grain; cutting H too gives parts whose rows fit a column tile (wide x along C).
COLUMN_LANES = 1 << 15  # partial outputs (parts x outputs), at most


def _finer_columns(n: ComputeNode, g: LoweredGraph) -> ComputeNode:
    """n (split on its first reduced dim) with its second reduced dim cut in q pieces folded
    into the first, (s, h, ...) -> (s * q + j, h', ...) with h = j * k + h', where n's loads run
    along its outputs: the largest q dividing that dim that keeps parts x outputs within
    COLUMN_LANES and each part at least COLUMN_MIN_PART elements; n itself when none does."""
    if len(n.rshape) < 2 or not _columns(n, g):
        return n
    first, dim, rest = n.rshape[0], n.rshape[1], math.prod(n.rshape[2:])
    outputs = math.prod(n.shape)
    q = next((q for q in range(dim, 1, -1) if dim % q == 0
              and first * q * outputs <= COLUMN_LANES
              and (dim // q) * rest >= COLUMN_MIN_PART), None)
    if q is None:
        return n
    k, fn = dim // q, n.fn
    return dataclasses.replace(
        n, rshape=(first * q, k, *n.rshape[2:]),
        fn=lambda i, r: fn(i, [ir.FloorDiv(r[0], q), ir.ModIndex(r[0], q) * k + r[1], *r[2:]]))


def _columns(n, g: LoweredGraph) -> bool:
    """A reduction whose loads run along its outputs (stride 1 in the last output dim), at least
    as much as along its last reduced dim: one program per few outputs would read across the
    grain (where the two tie, splitting still spreads the work over more programs)."""
    if not (isinstance(n, ComputeNode) and n.kind == "reduction" and n.reduce_op in SPLIT_OPS
            and n.shape and n.rshape):
        return False
    i, r = g.symbols.ranges("i", n.shape), g.symbols.ranges("r", n.rshape)
    col, row = grain(ir.loads(n.fn(i, r)), i[-1], r[-1], g)
    return col > 0 and col >= row


def grain(loads, out_sym, row_sym, g: LoweredGraph) -> tuple[int, int]:
    """Bytes of the loaded buffers read contiguously along `out_sym` and along `row_sym`. By
    bytes, not loads: convnext's LayerNorm weight gradient reads two [12544, 384] tensors along
    its outputs and two per-row statistics (50 KB) along its rows, and ran looped across the
    grain when each load counted one."""
    col = row = 0
    for load in loads:
        index = sympy.sympify(load.index)
        buf = g.buffers.get(load.buf)
        size = buf.nbytes if buf is not None else 1
        if index.diff(row_sym) == 1:
            row += size
        elif index.diff(out_sym) == 1:
            col += size
    return col, row


def _split(g: LoweredGraph, n: ComputeNode) -> list[ComputeNode]:
    fn, outer = n.fn, n.rshape[0]
    # the partials keep the accumulator's dtype (a bf16 sum's partials are float32)
    dtype = fn(g.symbols.ranges("i", n.shape), g.symbols.ranges("r", n.rshape)).dtype
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


def _split_variance(g: LoweredGraph, v: ComputeNode, split: dict) -> "list | None":
    """v = sum over r of (x - m[i] / N) ** 2 with m = sum over r of x, split already: the
    parallel form (module docstring), or None when v is not exactly that."""
    if v.reduce_op != "sum":
        return None
    i, r = g.symbols.ranges("i", v.shape), g.symbols.ranges("r", v.rshape)
    d = _square_of(v.fn(i, r))
    if d is None or d.name != "sub" or d.dtype not in (torch.float32, torch.float64):
        return None
    x, mean = d.args
    if not (isinstance(mean, ir.Op) and mean.name == "truediv" and len(mean.args) == 2
            and isinstance(mean.args[0], ir.Load) and isinstance(mean.args[1], ir.Const)):
        return None
    total = mean.args[0]
    m = split.get(total.buf)
    n_all = math.prod(v.rshape)
    if m is None or m.reduce_op != "sum" or tuple(m.shape) != tuple(v.shape) or \
            tuple(m.rshape) != tuple(v.rshape) or float(mean.args[1].value) != n_all or \
            m.fn(i, r) != x or total.dtype != d.dtype or \
            sympy.expand(total.index - ir.linear(i, g.buffers[m.name].stride)) != 0:
        return None
    dt, outer, n_part = d.dtype, v.rshape[0], math.prod(v.rshape[1:])
    shape = (outer,) + tuple(v.shape)
    stride = ir.contiguous_strides(shape)
    m_part = f"{m.name}_part"
    if g.buffers[m_part].dtype != dt:
        return None
    sq_name, dev_name = f"{v.name}_part", f"{v.name}_part_dev"
    for b in (sq_name, dev_name):
        g.buffers[b] = Buffer(b, shape, stride, dt, "compute")
    c = lambda s, ii: ir.op("truediv", dt, ir.Load(m_part, ir.linear([s, *ii], stride), dt),
                            ir.Const(float(n_part), dt))
    dev = lambda ii, rr: ir.op("sub", dt, m.fn(list(ii[1:]), [ii[0], *rr]), c(ii[0], ii[1:]))
    at = lambda b, s, ii: ir.Load(b, ir.linear([s, *ii], stride), dt)

    def whole_fn(ii, rr):
        mu = ir.op("truediv", dt, ir.Load(m.name, ir.linear(ii, g.buffers[m.name].stride), dt),
                   ir.Const(float(n_all), dt))
        shift = ir.op("sub", dt, c(rr[0], ii), mu)
        cross = ir.op("mul", dt, ir.op("mul", dt, ir.Const(2.0, dt), shift),
                      at(dev_name, rr[0], ii))
        square = ir.op("mul", dt, ir.Const(float(n_part), dt), ir.op("mul", dt, shift, shift))
        return ir.op("add", dt, ir.op("add", dt, at(sq_name, rr[0], ii), cross), square)
    part = lambda b, fn: ComputeNode(b, "reduction", shape, dt, fn, tuple(v.rshape[1:]), "sum",
                                     origins=v.origins, region=v.region)
    whole = ComputeNode(v.name, "reduction", v.shape, v.dtype, whole_fn, (outer,), "sum",
                        origins=v.origins, region=v.region)
    return [part(dev_name, dev),
            part(sq_name, lambda ii, rr: ir.op("mul", dt, dev(ii, rr), dev(ii, rr))), whole]


def _square_of(e) -> "ir.Op | None":
    """d when e is d * d or d ** 2."""
    if not isinstance(e, ir.Op):
        return None
    if e.name == "mul" and e.args[0] == e.args[1] and isinstance(e.args[0], ir.Op):
        return e.args[0]
    if e.name == "pow" and isinstance(e.args[1], ir.Const) and float(e.args[1].value) == 2.0 \
            and isinstance(e.args[0], ir.Op):
        return e.args[0]
    return None
