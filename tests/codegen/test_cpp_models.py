"""The shared benchmark models at scale "cpu" through backend="cpp": loss, parameter and input
grads against a float64 run (DESIGN.md policy), and no fallback ops."""
import copy

import pytest
import torch

import trainc
from trainc import records
from policy import TOLERANCE, assert_policy, rel_err

import models  # noqa: E402  benchmarks/suite_models (tests/conftest.py puts it on the path)

# the whole matrix the C++ issue names: every model, float32 and bfloat16, budgets None and 0
CASES = [(n, d, b) for n in models.NAMES for d in (torch.float32, torch.bfloat16)
         for b in (None, 0.0)]


def _grads(model, fn, inputs, loss_fn):
    xs = tuple(x.detach().requires_grad_(x.requires_grad) for x in inputs)
    loss = loss_fn(fn(*xs), xs)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, [x.grad for x in xs]


@pytest.mark.parametrize("name,dtype,budget", CASES)
def test_model_grads_match(name, dtype, budget):
    model, inputs, loss_fn = models.build(name, dtype=dtype)
    ref_model = copy.deepcopy(model).double()
    ref_inputs = tuple(x.double().requires_grad_(x.requires_grad) if x.is_floating_point() else x
                       for x in inputs)
    eager_model, comp_model = copy.deepcopy(model), copy.deepcopy(model)
    with records.recording() as recs:
        comp = _grads(comp_model, trainc.compile(comp_model, backend="cpp", memory_budget=budget),
                      inputs, loss_fn)
    assert recs and all(r.backend == "cpp" for r in recs)
    assert [op for r in recs for op in r.fallback_ops] == []
    eager = _grads(eager_model, eager_model, inputs, loss_fn)
    ref = _grads(ref_model, ref_model, ref_inputs, loss_fn)
    # the loss is float32 even for a bfloat16 model: judge it by the model's dtype
    k, floor = TOLERANCE[dtype]
    ec, ee = rel_err(comp[0], ref[0]), rel_err(eager[0], ref[0])
    assert ec <= k * ee + floor, f"{name} loss: err {ec:.3g} vs eager {ee:.3g}"
    for n in ref[1]:
        assert_policy(f"{name} grad {n}", comp[1][n], eager[1][n], ref[1][n])
    for i, (c, e, r) in enumerate(zip(comp[2], eager[2], ref[2])):
        assert_policy(f"{name} input grad {i}", c, e, r)
