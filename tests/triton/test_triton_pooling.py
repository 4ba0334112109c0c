"""Triton lowerings of 2-d max/avg pooling (forward and backward) hardtanh and cumsum against eager
(the same cases as tests/codegen/test_cpp_pooling.py)."""
import pytest
import torch

from pool_cases import AVG_CASES, MAX_CASES, avg_pool, hardtanh, max_pool, special
from triton_helpers import check


@pytest.mark.parametrize("case", MAX_CASES, ids=str)
def test_max_pool_with_indices_and_backward(case):
    fn, args = max_pool(case)
    check(fn, *args)


@pytest.mark.parametrize("case", AVG_CASES, ids=str)
def test_avg_pool_and_backward(case):
    fn, args = avg_pool(case)
    check(fn, *args)


def test_hardtanh_and_backward():
    check(hardtanh, special(37))


def test_cumsum_int_and_float_along_any_dim():
    def f(m, a):
        return torch.cumsum(m, 1), torch.cumsum(a, 0), torch.cumsum(a, -1, dtype=torch.float64)
    m = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.int32)
    check(f, m, torch.randn(7, 13))
