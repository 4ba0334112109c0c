"""Transposed stores of a column reduction's kernel (codegen/cpp/transpose.py): a value stored
transposed for an mm while its column sums accumulate goes through per-block tiles; results are
those of eager (bitwise those of the untiled loop: same values, same summation order)."""
from __future__ import annotations

import pytest
import torch

import trainc.codegen.cpp.plan as P
from cpp_helpers import check, compile_cpp


def _linear_backward(g, d, x):
    h = g * d  # an activation's gradient: read by the weight-gradient mm and the bias sum
    return h.t() @ x, h.sum(0)


@pytest.mark.parametrize("rows", [64, 48, 40])  # 40: not a multiple of the tile, untiled
def test_transposed_store_with_column_sum(rows):
    args = torch.randn(rows, 96), torch.randn(rows, 96), torch.randn(rows, 8)
    c = check(_linear_backward, *args, atol=1e-5)
    assert ("tb += 16" in c.extra["cpp"]) == (rows % 16 == 0)


def test_tiled_and_untiled_stores_are_bitwise_equal(monkeypatch):
    args = torch.randn(64, 96), torch.randn(64, 96), torch.randn(64, 8)
    tiled = compile_cpp(_linear_backward, *args)
    monkeypatch.setattr(P, "tiled_stores", lambda *a, **k: {})
    plain = compile_cpp(_linear_backward, *args)
    assert "tb += 16" in tiled.extra["cpp"] and "tb += 16" not in plain.extra["cpp"]
    for a, b in zip(tiled.run(list(args)), plain.run(list(args))):
        assert torch.equal(a, b)


def test_bfloat16_transposed_store():
    args = [torch.randn(32, 64).bfloat16() for _ in range(2)] + [torch.randn(32, 8).bfloat16()]
    c = check(_linear_backward, *args, rtol=2e-2, atol=2e-2)
    assert "tb += 16" in c.extra["cpp"]
