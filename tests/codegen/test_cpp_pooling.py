"""C++ lowerings of 2-d max/avg pooling (forward and backward) and hardtanh against eager:
values within rounding, max-pool indices exact (ties: the first max; NaN: eager's choice)."""
import pytest
import torch
import torch.nn.functional as F

import trainc
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


def test_recomputed_max_pool_indices_are_computed_once_per_window(tmp_path, monkeypatch):
    """A backward that recomputes the pool's indices (the partition's choice: they are cheap)
    stores them once instead of inlining a 9-way argmax into each of the 4 windows a 3x3
    stride-2 pool's input position reads: one argmax in the backward's C++ (9 NaN checks),
    not five (45)."""
    monkeypatch.setenv("TRAINC_DEBUG_DIR", str(tmp_path))
    torch._dynamo.reset()
    w = torch.randn(8, 3, 3, 3, requires_grad=True)
    x = torch.randn(2, 3, 16, 16)

    def f(x, w):
        return F.max_pool2d(F.conv2d(x, w, padding=1).relu(), 3, 2, 1).square().sum()

    got = trainc.compile(f, backend="cpp", cache_artifacts=False)(x, w)
    got.backward()
    g = w.grad.clone()
    w.grad = None
    f(x, w).backward()
    torch.testing.assert_close(g, w.grad)
    src = "".join(p.read_text() for p in tmp_path.rglob("31_bwd_wrapper.py"))
    assert src.count("std::isnan") == 9, src.count("std::isnan")
