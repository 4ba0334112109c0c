"""2-d pooling lowerings: max pooling with indices and average pooling, with their backwards.

Forwards read each window with clamped indices and mask the positions outside the input;
backwards gather, for each input element, the few output windows that contain it, in eager's
order of accumulation (ascending output position), so the sums round as eager's do.
"""
from __future__ import annotations

from itertools import product
from typing import Optional

import sympy
import torch

from trainc.codegen import ir
from trainc.codegen.ir import Const, IndexValue, TensorValue
from trainc.codegen.lowerings import register
from trainc.codegen.lowerings.common import cast, const, opmath

aten = torch.ops.aten
I64 = torch.int64
MAX_WINDOW = 64  # window positions unrolled in one expression (max pool, backward gathers)


class Pool:
    """Normalized 2-d pooling arguments of one dim pair (h, w)."""

    def __init__(self, x: TensorValue, kernel, stride, padding, dilation, out_hw):
        two = lambda v, dflt: [int(a) for a in (list(v) * (2 // len(v)) if v else dflt)]
        self.k = two(kernel, None)
        self.s = two(stride, self.k)
        self.p = two(padding, [0, 0])
        self.d = two(dilation, [1, 1])
        self.n_in = [int(a) for a in x.shape[-2:]]
        self.n_out = [int(a) for a in out_hw]

    def span(self, j: int) -> int:
        return (self.k[j] - 1) * self.d[j] + 1

    def every_window_reads_input(self) -> bool:
        """Each output window holds at least one input position (else eager's index is an
        arbitrary one: leave those shapes to ATen)."""
        for j in range(2):
            for o in range(self.n_out[j]):
                start = o * self.s[j] - self.p[j]
                if not any(0 <= start + a * self.d[j] < self.n_in[j] for a in range(self.k[j])):
                    return False
        return True


def _inside(q: sympy.Expr, n: int) -> list:
    """Conditions 0 <= q < n that are not known statically."""
    lo, hi = ir.bounds(q)
    conds = []
    if lo < 0:
        conds.append(ir.op("ge", torch.bool, IndexValue(q), Const(0, I64)))
    if hi >= n:
        conds.append(ir.op("lt", torch.bool, IndexValue(q), Const(n, I64)))
    return conds


def _clamp(q: sympy.Expr, n: int) -> sympy.Expr:
    lo, hi = ir.bounds(q)
    if lo < 0:
        q = sympy.Max(q, 0)
    if hi >= n:
        q = sympy.Min(q, n - 1)
    return q


def _all(conds: list) -> Optional[ir.Expr]:
    out = None
    for c in conds:
        out = c if out is None else ir.op("and", torch.bool, out, c)
    return out


@register(aten.max_pool2d_with_indices.default)
def max_pool2d(ctx, node, x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    out, ind_meta = node.meta["val"]
    pool = Pool(x, kernel, stride, padding, dilation, out.shape[-2:])
    if pool.k[0] * pool.k[1] > MAX_WINDOW or not pool.every_window_reads_input():
        return NotImplemented
    if not x.dtype.is_floating_point:
        return NotImplemented  # eager's -inf start has no integer spelling here
    (H, W), dt = pool.n_in, opmath(x.dtype)

    def chain(i):
        """Eager's loop: start at -inf, take a position when it is greater or NaN; the index
        starts at the window's first input position."""
        *lead, oh, ow = i
        best, bi, seen = const(float("-inf"), dt), Const(0, I64), None  # True: surely seen
        for a, b in product(range(pool.k[0]), range(pool.k[1])):
            h = oh * pool.s[0] - pool.p[0] + a * pool.d[0]
            w = ow * pool.s[1] - pool.p[1] + b * pool.d[1]
            valid = _all(_inside(h, H) + _inside(w, W))
            v = cast(x(list(lead) + [_clamp(h, H), _clamp(w, W)]), dt)
            pos = IndexValue(h * W + w)
            if seen is None and valid is None:  # the first position, surely in the input
                best, bi, seen = v, pos, True
                continue
            take = ir.op("or", torch.bool, ir.op("gt", torch.bool, v, best),
                         ir.op("isnan", torch.bool, v))
            if seen is not True:
                first = Const(True, torch.bool) if seen is None else \
                    ir.op("not", torch.bool, seen)
                take = ir.op("or", torch.bool, take, first)
            if valid is not None:
                take = ir.op("and", torch.bool, take, valid)
            seen = True if valid is None or seen is True else \
                valid if seen is None else ir.op("or", torch.bool, seen, valid)
            best = ir.op("where", dt, take, v, best)
            bi = ir.op("where", I64, take, pos, bi)
        return best, bi
    values = TensorValue(tuple(out.shape), out.dtype, lambda i: chain(i)[0])
    indices = TensorValue(tuple(ind_meta.shape), I64, lambda i: chain(i)[1])
    return values, indices


def _windows_of(q: sympy.Expr, j: int, pool: Pool, reach: int):
    """The output positions o (ascending) whose window could hold input position q, each with
    its clamped index and the conditions that it is a real output: o = (q + p) // s - t."""
    s, p, n_out = pool.s[j], pool.p[j], pool.n_out[j]
    top = ir.FloorDiv(q + p, s)
    out = []
    for t in reversed(range((reach - 1) // s + 1)):
        o = top - t
        out.append((o, _clamp(o, n_out), _inside(o, n_out)))
    return out


def _gather(pool: Pool, reach, lead, h, w, term, dt) -> ir.Expr:
    """Sum over the candidate windows (oh, ow) of term(oh, ow, conds), in ascending order."""
    total = const(0, dt)
    for oh, ch, c_h in _windows_of(h, 0, pool, reach[0]):
        for ow, cw, c_w in _windows_of(w, 1, pool, reach[1]):
            total = ir.op("add", dt, total, term(oh, ow, list(lead) + [ch, cw], c_h + c_w))
    return total


def _count(pool: Pool, reach) -> int:
    return ((reach[0] - 1) // pool.s[0] + 1) * ((reach[1] - 1) // pool.s[1] + 1)


@register(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_backward(ctx, node, g, x, kernel, stride, padding, dilation, ceil_mode, indices):
    out = node.meta["val"]
    pool = Pool(x, kernel, stride, padding, dilation, g.shape[-2:])
    reach = [pool.span(0), pool.span(1)]
    if _count(pool, reach) > MAX_WINDOW:
        return NotImplemented
    W, dt = pool.n_in[1], opmath(out.dtype)
    if _count(pool, reach) > 1:
        # each input position reads several windows' index and gradient: computed once each
        # (indices recomputed in the backward are a 9-way argmax; inlined, 4 of them ran per
        # input element of a 3x3 stride-2 pool)
        indices, g = ctx.realize(indices), ctx.realize(g)

    def fn(i):
        *lead, h, w = i

        def term(oh, ow, at, conds):
            # the stored index names one input position, so no window-membership test
            hit = ir.op("eq", torch.bool, cast(indices(at), I64), IndexValue(h * W + w))
            hit = _all(conds + [hit])
            return ir.op("where", dt, hit, cast(g(at), dt), const(0, dt))
        return _gather(pool, reach, lead, h, w, term, dt)
    return TensorValue(tuple(out.shape), out.dtype, fn)


def _avg_divisor(pool: Pool, oh, ow, include_pad: bool, override) -> ir.Expr:
    """Eager's divide factor of window (oh, ow) as an int64 index value."""
    if override:
        return Const(int(override), I64)
    sizes = []
    for j, o in enumerate((oh, ow)):
        start = o * pool.s[j] - pool.p[j]
        if include_pad:
            sizes.append(sympy.Min(start + pool.k[j], pool.n_in[j] + pool.p[j]) - start)
        else:
            sizes.append(sympy.Min(start + pool.k[j], pool.n_in[j]) - sympy.Max(start, 0))
    return IndexValue(sizes[0] * sizes[1])


def _avg_args(x, kernel, stride, padding, out_hw) -> Optional[Pool]:
    pool = Pool(x, kernel, stride, padding, (1,), out_hw)
    if not x.dtype.is_floating_point or not pool.every_window_reads_input():
        return None
    return pool


@register(aten.avg_pool2d.default)
def avg_pool2d(ctx, node, x, kernel, stride=(), padding=(0,), ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    out = node.meta["val"]
    pool = _avg_args(x, kernel, stride, padding, out.shape[-2:])
    if pool is None:
        return NotImplemented
    (H, W), dt = pool.n_in, opmath(x.dtype)
    # window offsets past H + p never hold an input position
    rshape = [min(pool.k[0], H + pool.p[0]), min(pool.k[1], W + pool.p[1])]

    def fn(i, r):
        *lead, oh, ow = i
        h = oh * pool.s[0] - pool.p[0] + r[0]
        w = ow * pool.s[1] - pool.p[1] + r[1]
        valid = _all(_inside(h, H) + _inside(w, W))
        v = cast(x(list(lead) + [_clamp(h, H), _clamp(w, W)]), dt)
        return v if valid is None else ir.op("where", dt, valid, v, const(0, dt))
    s = ctx.reduction(tuple(out.shape), rshape, "sum", dt, fn)

    def divide(i):
        div = _avg_divisor(pool, i[-2], i[-1], count_include_pad, divisor_override)
        return ir.op("truediv", dt, s(i), cast(div, dt))
    return TensorValue(tuple(out.shape), out.dtype, divide)


@register(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(ctx, node, g, x, kernel, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    out = node.meta["val"]
    pool = _avg_args(x, kernel, stride, padding, g.shape[-2:])
    if pool is None or _count(pool, pool.k) > MAX_WINDOW:
        return NotImplemented
    dt = opmath(out.dtype)

    def fn(i):
        *lead, h, w = i

        def term(oh, ow, at, conds):
            # a candidate window holds (h, w) when it ends after it: start + k > q
            for j, (o, q) in enumerate(((oh, h), (ow, w))):
                end = o * pool.s[j] - pool.p[j] + pool.k[j]
                if ir.bounds(end - q)[0] < 1:
                    conds.append(ir.op("gt", torch.bool, IndexValue(end), IndexValue(q)))
            div = _avg_divisor(pool, _clamp_o(oh, pool, 0), _clamp_o(ow, pool, 1),
                               count_include_pad, divisor_override)
            v = ir.op("truediv", dt, cast(g(at), dt), cast(div, dt))
            hit = _all(conds)
            return v if hit is None else ir.op("where", dt, hit, v, const(0, dt))
        return _gather(pool, pool.k, lead, h, w, term, dt)
    return TensorValue(tuple(out.shape), out.dtype, fn)


def _clamp_o(o, pool: Pool, j: int):
    return _clamp(o, pool.n_out[j])
