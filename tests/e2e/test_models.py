"""Every shared-suite model at scale "cpu": loss, grads, and 3 SGD steps match eager (fp64 policy)."""
import copy

import pytest
import torch

import trainc
from policy import assert_policy

import models  # noqa: E402  benchmarks/suite_models (tests/conftest.py puts it on the path)


def _train(model, step_fn, inputs, loss_fn, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, first_grads, first_input_grads = [], None, None
    for i in range(steps):
        xs = tuple(x.detach().requires_grad_(x.requires_grad) for x in inputs)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(step_fn(*xs), xs)
        loss.backward()
        if i == 0:
            first_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            first_input_grads = [x.grad for x in xs]
        losses.append(loss.detach())
        opt.step()
    return losses, first_grads, first_input_grads, model.state_dict()


@pytest.mark.parametrize("name", models.NAMES)
def test_model_matches_eager(name):
    model, inputs, loss_fn = models.build(name)
    ref_model = copy.deepcopy(model).double()
    ref_inputs = tuple(x.double().requires_grad_(x.requires_grad) if x.is_floating_point() else x
                       for x in inputs)
    eager_model = copy.deepcopy(model)
    eager = _train(eager_model, eager_model, inputs, loss_fn, 3)
    compiled_model = copy.deepcopy(model)
    comp = _train(compiled_model, trainc.compile(compiled_model, backend="aten"), inputs, loss_fn, 3)
    ref = _train(ref_model, ref_model, ref_inputs, loss_fn, 3)
    for i, (c, e, r) in enumerate(zip(comp[0], eager[0], ref[0])):
        assert_policy(f"{name} loss step {i}", c, e, r)
    for n in ref[1]:
        assert_policy(f"{name} grad {n}", comp[1][n], eager[1][n], ref[1][n])
    for i, (c, e, r) in enumerate(zip(comp[2], eager[2], ref[2])):
        assert_policy(f"{name} input grad {i}", c, e, r)
    for n in ref[3]:
        assert_policy(f"{name} state {n} after 3 steps", comp[3][n], eager[3][n], ref[3][n])
