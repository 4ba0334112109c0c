"""Matrix products through oneDNN where timing says it beats ATen's mm (codegen/cpp/gemm.py):
the same products as ATen's, chosen per call site, with eager's gradients either way."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import trainc
from cpp_helpers import compile_cpp
from policy import assert_same
from trainc.codegen.cpp import gemm
from trainc.config import make_config

pytestmark = pytest.mark.skipif(gemm._LINEAR is None or not torch.backends.mkldnn.is_available(),
                                reason="this torch has no oneDNN inner product")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_onednn_products_equal_atens(dtype):
    torch.manual_seed(0)
    a, b, bias = torch.randn(24, 40), torch.randn(40, 16), torch.randn(16)
    c = torch.randn(24, 16)
    a, b, bias, c = (t.to(dtype) for t in (a, b, bias, c))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for x, y in ((a, b), (a.t().contiguous().t(), b), (a, b.t().contiguous().t())):
        assert_same(gemm.mm(x, y), torch.mm(x, y), what="mm", **tol)
        assert_same(gemm.addmm(bias, x, y), torch.addmm(bias, x, y), what="addmm", **tol)
        acc = c.clone()
        assert gemm.addmm_into(acc, x, y) is acc
        assert_same(acc, torch.addmm(c, x, y), what="addmm_into", **tol)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))


def _wrapper_calls(monkeypatch, faster: bool, dtype=torch.float32, **options):
    """The extern functions of a compiled MLP's forward with oneDNN always (never) faster."""
    monkeypatch.setattr(gemm, "_faster", lambda *a: faster)
    monkeypatch.setattr(gemm, "_chosen", {})
    x = torch.randn(8, 32, dtype=dtype)
    w1, b1 = torch.randn(64, 32, dtype=dtype), torch.randn(64, dtype=dtype)
    w2 = torch.randn(32, 64, dtype=dtype)

    def f(x, w1, b1, w2):
        return torch.nn.functional.linear(x, w1, b1).relu() @ w2.t()
    c = compile_cpp(f, x, w1, b1, w2, config=make_config(**options))
    ns = c.run.__globals__
    out = c.run([x, w1, b1, w2])[0]
    assert_same(out, f(x, w1, b1, w2), rtol=1e-5, atol=1e-5, what="output")
    return [ns[k] for k in sorted(ns) if k.startswith("op_")], c.source


def test_each_call_site_runs_what_timed_faster(monkeypatch):
    ops, source = _wrapper_calls(monkeypatch, True)
    assert gemm.addmm in ops and gemm.mm in ops and "out=" not in source
    ops, source = _wrapper_calls(monkeypatch, False)
    assert torch.addmm in ops and torch.mm in ops and "out=" in source


def test_aten_mode_and_float64_never_use_onednn(monkeypatch):
    ops, _ = _wrapper_calls(monkeypatch, True, cpp_gemm="aten")
    assert gemm.mm not in ops and gemm.addmm not in ops
    ops, _ = _wrapper_calls(monkeypatch, True, dtype=torch.float64)  # oneDNN refuses float64
    assert gemm.mm not in ops and gemm.addmm not in ops
    with pytest.raises(ValueError, match="cpp_gemm"):
        make_config(cpp_gemm="mkl")


def test_gradients_accumulate_into_grad_through_onednn(monkeypatch):
    """Weight gradients added into existing .grad tensors in place (trainc/accumulate.py) run
    as oneDNN's product plus one add when that is faster: two steps give eager's sums."""
    monkeypatch.setattr(gemm, "_faster", lambda *a: True)
    monkeypatch.setattr(gemm, "_chosen", {})
    monkeypatch.setattr(trainc.accumulate, "MIN_BYTES", 0)
    calls = []
    real = gemm.addmm_into
    monkeypatch.setattr(gemm, "addmm_into", lambda *a: calls.append(1) or real(*a))
    model, ref = _mlp(), _mlp()
    compiled = trainc.compile(model, backend="cpp", cache_artifacts=False)
    x = torch.randn(16, 32)
    for _ in range(2):
        compiled(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
    assert calls, "no in-place accumulation ran through oneDNN"
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert_same(p.grad, q.grad, rtol=1e-5, atol=1e-5, what=n)
