"""Matrix products of the C++ backend's wrappers through oneDNN where that is faster than ATen's
mm/addmm (MKL in torch's CPU builds), decided per call site at compile time by timing both.

Why: oneDNN's inner product (`torch.ops.mkldnn._linear_pointwise`, the ATen op Inductor uses
for frozen linears) beat MKL at gpt's shapes on the AVX-512 dev box (BENCHMARKS.md); on other
CPUs MKL may win, hence the measurement. oneDNN sums in another order: results differ from MKL's by float32
rounding (DESIGN.md's policy judges them against float64, as any other kernel's).

oneDNN returns a new tensor (no out= form), so a call site it wins is emitted as an extern with
a fresh result instead of ATen's out= into a pooled buffer. Config.cpp_gemm: "auto" (time
both) or "aten" (never oneDNN).
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import torch

from trainc.codegen.graph import CallNode, LoweredGraph, TensorArg

aten = torch.ops.aten
_LINEAR = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
DTYPES = (torch.float32, torch.bfloat16)  # oneDNN's inner product refuses float64 and float16


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b: b's transpose is the inner product's [N, K] weight."""
    return _LINEAR(a, b.t(), None, "none", [], "")


def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bias + a @ b, bias of shape [N]."""
    return _LINEAR(a, b.t(), bias, "none", [], "")


def addmm_into(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c += a @ b in place (a parameter's .grad accumulating its new gradient): the product,
    then one add into c."""
    return c.add_(mm(a, b))


CALLS = {aten.mm.default: mm, aten.addmm.default: addmm}
_chosen: dict[tuple, bool] = {}  # (call, argument shapes/strides/dtype, threads) -> oneDNN


def chooser(graph: LoweredGraph, mode: str) -> Callable[..., Optional[Callable]]:
    """For write_wrapper: the oneDNN function a call site runs, or None (ATen's call). With
    `inplace`, for an addmm the wrapper runs in place into its first argument."""
    def choose(call: CallNode, inplace: bool = False) -> Optional[Callable]:
        if mode != "auto" or call.kind != "extern" or call.target not in CALLS or \
                inplace and (call.inplace is None or call.inplace[1] != 0):
            return None  # in place: only into the first argument (addmm_'s self)
        shapes = _arguments(call, graph, inplace)
        if shapes is None:
            return None
        key = (call.target, inplace, tuple(shapes), torch.get_num_threads())
        if key not in _chosen:
            _chosen[key] = _faster(call.target, inplace, shapes)
        return (addmm_into if inplace else CALLS[call.target]) if _chosen[key] else None
    return choose


def _arguments(call: CallNode, graph: LoweredGraph, inplace: bool) -> Optional[list]:
    """(shape, stride, dtype) of each tensor argument when oneDNN can run the call: no kwargs
    (beta/alpha), float32 or bfloat16, a non-empty product, no broadcast (zero-stride)
    operand, and for addmm a bias of shape [N] (in place: the [M, N] tensor added into)."""
    if _LINEAR is None or not torch.backends.mkldnn.is_available() or \
            not torch.backends.mkldnn.enabled or call.kwargs or \
            not all(isinstance(a, TensorArg) for a in call.args):
        return None
    out = []
    for a in call.args:
        buf = graph.buffers[a.buf]
        shape, stride = (buf.shape, buf.stride) if a.whole else (a.shape, a.stride)
        out.append((tuple(shape), tuple(stride), buf.dtype))
    *rest, (a_shape, a_stride, dt), (b_shape, b_stride, _) = out
    if any(d != dt for _, _, d in out) or dt not in DTYPES or len(a_shape) != 2 or \
            len(b_shape) != 2 or 0 in a_shape + b_shape or 0 in a_stride + b_stride:
        return None
    m, n = a_shape[0], b_shape[1]
    if inplace:  # addmm_ into its [M, N] first argument
        ok = len(rest) == 1 and rest[0][0] == (m, n)
    else:  # mm, or addmm with a dense [N] bias
        ok = not rest or rest[0][:2] == ((n,), (1,))
    return out if ok else None


def _faster(target, inplace: bool, shapes: Sequence[tuple]) -> bool:
    """Time ATen's call (out= into a buffer, or in place) against oneDNN's on random
    arguments of these layouts (the best of 5 after 2 warmups each); True when oneDNN's is
    faster."""
    gen = torch.Generator().manual_seed(0)
    args = [torch.empty_strided(s, st, dtype=dt).copy_(
        torch.randn(s, generator=gen).to(dt)) for s, st, dt in shapes]
    if inplace:
        ours, theirs = addmm_into, torch.Tensor.addmm_
    else:
        ours = CALLS[target]
        aten_fn = torch.mm if target is aten.mm.default else torch.addmm
        out = torch.empty((shapes[-2][0][0], shapes[-1][0][1]), dtype=shapes[-1][2])

        def theirs(*xs):
            return aten_fn(*xs, out=out)
    try:
        ours(*args)
    except RuntimeError:  # this oneDNN refuses the layout or type: ATen's call
        return False

    def best(fn) -> float:
        for _ in range(2):
            fn()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)
    return best(lambda: ours(*args)) < best(lambda: theirs(*args))
