"""The policy with every relaxation on still catches a wrong gradient planted in trainc's compiled
backward, in each dtype and below SMALL_NUMEL elements (where k doubles and bf16 expects a unit
roundoff); and benchmarks/policy_review.py runs end to end on a few programs."""
import importlib.util
import os

import pytest
import torch

from trainc import runtime
from trainc.testing import assert_grads_match
from trainc.testing.policy import ALL_ON, Relaxations

REVIEW = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "policy_review.py")


def _scale_first_grad(monkeypatch, by: float) -> None:
    """A wrong kernel: the compiled backward's first gradient times `by`."""
    orig = runtime._grads_by_input

    def planted(sig, results):
        results = list(results)
        results[0] = (results[0].double() * by).to(results[0].dtype)
        return orig(sig, results)
    monkeypatch.setattr(runtime, "_grads_by_input", planted)


def _program(x, w):
    return (torch.tanh(x @ w).sum(-1),)


# (dtype, x shape, planted scale): float32 and float64 by 1e-3 / 1e-6 of the value, bf16 by
# 5e-2 (1e-3 rounds back to the same bf16 value); (1, 3) @ (3, 2) gives a 6-element
# gradient of w, under SMALL_NUMEL.
CASES = [(torch.float32, (8, 5), 1 + 1e-3), (torch.float32, (1, 3), 1 + 1e-3),
         (torch.float64, (8, 5), 1 + 1e-6), (torch.float64, (1, 3), 1 + 1e-6),
         (torch.bfloat16, (8, 5), 1.25), (torch.bfloat16, (1, 3), 1.25)]


def _inputs(dtype, shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    w = torch.randn(shape[-1], 2, generator=g, dtype=torch.float64).to(dtype)
    return [x, w.requires_grad_()]


@pytest.mark.parametrize("dtype,shape,by", CASES, ids=lambda c: str(c))
def test_planted_wrong_gradient_is_caught_with_all_relaxations_on(monkeypatch, dtype, shape, by):
    assert assert_grads_match(_program, _inputs(dtype, shape), backend="aten") == []
    _scale_first_grad(monkeypatch, by)
    with pytest.raises(AssertionError, match="grad of input 1"):
        assert_grads_match(_program, _inputs(dtype, shape), backend="aten")


def test_relaxations_default_is_all_on():
    assert ALL_ON == Relaxations() and all(vars(ALL_ON).values())


def test_review_script_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("policy_review", REVIEW)
    review = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(review)
    progs = review.sample(3, seed=1, max_ops=4)
    assert len(progs) == 3

    class Args:
        eps, atol, rtol = 1e-6, 1e-6, 1e-4
    rows = [review.review(p, "aten", Args) for p in progs]
    assert not any("crash" in r for r in rows), [r.get("crash") for r in rows]
    assert all(set(r["policy"]["failing"]) == set(review.CONFIGS) for r in rows if "policy" in r)
    table = review.tables(rows)
    assert "| small_k |" in table and "| scale " in table


def _estimates(f, make):
    from trainc.testing.check import _clone, _conditioning_parts, _run
    eager = _run(f, None, make(), 0)
    ref = _run(f, None, [_clone(x, torch.float64) for x in make()], 0, cast=torch.float64,
               tangent_dtypes=eager.tangent_dtypes)
    return _conditioning_parts(f, make, 0, eager.tangent_dtypes, ref)


def test_estimates_keep_inputs_exact():
    """grad of sin(x) - x at |x| ~ 1e4 is well conditioned for every evaluation that gets x
    exactly (cos of an exact float32 input); the estimates once moved x and said 4e-4."""
    def make():
        g = torch.Generator().manual_seed(840)
        x = (torch.randn(17, 17, generator=g, dtype=torch.float64) * 1e4).float()
        return [x.requires_grad_()]
    parts = _estimates(lambda x: (torch.sin(x) - x,), make)
    for name in ("rounding_conditioning", "emulated_spread"):
        assert parts[name].get("grad of input 0", 0.0) < 1e-6, (name, parts[name])


def test_emulated_spread_rounds_equal_values_alike():
    """std over copies of one value is exactly 0 in any evaluation; nudging each copy its own
    way once made its 0/0 gradient look like a valid spread of 0.49."""
    def make():
        x = torch.tensor([[0.3]]).expand(17, 3).requires_grad_()
        return [x]
    parts = _estimates(lambda x: (torch.sin(x * 2.5).std(1),), make)
    assert parts["emulated_spread"].get("grad of input 0", 0.0) < 1e-6, parts
