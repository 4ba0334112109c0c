"""C++ lowerings of 2-d max/avg pooling (forward and backward) and hardtanh against eager:
values within rounding, max-pool indices exact (ties: the first max; NaN: eager's choice)."""
import pytest

from cpp_helpers import check, compile_cpp
from policy import assert_policy
from pool_cases import AVG_CASES, MAX_CASES, avg_pool, hardtanh, max_pool, special


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


@pytest.mark.parametrize("case,make", [(MAX_CASES[0], max_pool), (AVG_CASES[1], avg_pool)],
                         ids=["max", "avg"])
def test_pooling_bf16_within_policy(case, make):
    fn, (x, g) = make(case)
    xb, gb = x.bfloat16(), g.bfloat16()
    c = compile_cpp(fn, xb, gb)
    outs, refs, exact = c.run([xb, gb]), fn(xb, gb), fn(x.double(), g.double())
    for k, (o, r, r64) in enumerate(zip(outs, refs, exact)):
        assert_policy(f"output {k}", o, r, r64)  # exact for the int64 indices
    assert not c.fallback_ops
