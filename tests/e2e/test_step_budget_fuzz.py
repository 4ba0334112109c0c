"""Random module stacks (trainc.testing) trained by compile_step at memory budgets 0.0 and 0.5
and without one (the min-cut's default plan inside the step; aten, cpp and triton backends):
losses, parameters and buffers after two SGD-momentum steps match eager under the fp64 policy."""
import copy

import pytest
import torch
from hypothesis import assume, given, settings

import trainc
from policy import assert_policy
from trainc.testing import module_stacks


def _loss(model, x):
    return model(x)[0].float().pow(2).mean()


def _train(model, x, compiled, budget=None, backend="aten"):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if compiled:
        step = trainc.compile_step(model, _loss, opt, backend=backend, memory_budget=budget)
    else:
        def step(x):
            loss = _loss(model, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
    losses = [step(x) for _ in range(2)]
    return losses, model.state_dict()


# The cpp backend compiles C++ per example, and a budget sweeps min-cuts per example: fewer
# examples keep the default run short.
@pytest.mark.parametrize("backend,budget,examples", [("aten", 0.0, 4), ("aten", 0.5, 3),
                                                      ("cpp", 0.0, 2), ("aten", None, 6),
                                                      ("cpp", None, 3), ("triton", None, 2)])
def test_module_stacks_step_at_budgets(backend, budget, examples):
    @settings(max_examples=examples)
    @given(stack=module_stacks())
    def prop(stack):
        assume(not any("Dropout" in ctor for ctor, _ in stack.layers))  # eager draws other bits
        model = stack.make_model()
        assume(any(p.requires_grad for p in model.parameters()))
        x = stack.make_inputs()[0].detach()
        ref = _train(stack.make_model(torch.float64), stack.make_inputs(torch.float64)[0]
                     .detach(), False)
        eager = _train(copy.deepcopy(model), x, False)
        comp = _train(copy.deepcopy(model), x, True, budget, backend)
        for i, (c, e, r) in enumerate(zip(comp[0], eager[0], ref[0])):
            assert_policy(f"loss {i}\n{stack.source}", c, e, r)
        for k in ref[1]:
            assert_policy(f"{k}\n{stack.source}", comp[1][k], eager[1][k], ref[1][k])
    prop()
