"""Triton lowerings of 2-d max/avg pooling (forward and backward) and hardtanh against eager
(the same cases as tests/codegen/test_cpp_pooling.py)."""
import pytest

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
