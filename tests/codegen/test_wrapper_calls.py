"""How the wrapper calls externs: through torch's generated Python bindings (an OpOverload call
takes the slower boxed path), with the same results."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from cpp_helpers import check


def _externs(c) -> list:
    ns = c.run.__globals__
    return [ns[k] for k in sorted(ns) if k.startswith("op_")]


def test_mm_addmm_bmm_call_the_torch_bindings_with_out(monkeypatch):
    monkeypatch.setenv("TRAINC_CPP_GEMM", "aten")  # not oneDNN's (test_cpp_gemm.py)

    def f(x, w, b, y):
        return F.linear(x, w, b).relu() @ w, torch.bmm(y, y.transpose(1, 2))
    c = check(f, torch.randn(8, 16), torch.randn(16, 16), torch.randn(16),
              torch.randn(2, 4, 8), atol=1e-5)
    ops = _externs(c)
    assert torch.addmm in ops and torch.mm in ops and torch.bmm in ops, ops
    assert all(not isinstance(o, torch._ops.OpOverload) for o in ops), ops
    assert "out=" in c.source


def test_convolution_calls_the_torch_binding():
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    c = check(lambda x, w: F.conv2d(x, w, padding=1).relu(), x, w, atol=1e-5)
    assert torch.convolution in _externs(c)


def test_strided_views_of_extern_arguments_keep_their_offsets():
    def f(x, w):
        return x.t() @ w, x[2:, 2:] @ w[2:, :6]  # a view at offset 0 and two at offsets
    c = check(f, torch.randn(8, 8), torch.randn(8, 8), atol=1e-5)
    assert "storage_offset() + 0)" not in c.source  # offset 0: as_strided keeps the base's
    assert "storage_offset() + 18)" in c.source


def test_a_value_two_matmuls_read_is_stored_once():
    """A pointwise value read by two matmuls, one through a transpose (the SwiGLU backward's
    up-projection gradient: one matmul for the input gradient, one for the weight gradient):
    stored once in its own layout and passed transposed, not stored again as a transposing
    copy (graph._extern_readers)."""
    def f(g, s, w, x):
        h = g * s.sigmoid()
        return h @ w, h.t() @ x
    c = check(f, *(torch.randn(16, 24) for _ in range(2)), torch.randn(24, 8),
              torch.randn(16, 8), atol=1e-5)
    assert len(c.kernels) == 1, [k.name for k in c.kernels]
    assert c.kernels[0].bytes_written == 16 * 24 * 4, c.kernels
