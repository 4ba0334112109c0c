"""Dropout under trainc: backward sees forward's mask, and one seed gives the same bits twice."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import trainc
from fuzz_helpers import combos, examples
from trainc.testing import bitwise_equal

COMBOS = combos()
SHAPES = st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple)


def _run(f, x, seed):
    torch.manual_seed(seed)
    xi = x.detach().clone().requires_grad_()
    y = f(xi)
    y.backward(torch.ones_like(y))
    return y.detach(), xi.grad


@pytest.mark.parametrize("backend,budget", COMBOS)
def test_dropout_backward_uses_forward_mask(backend, budget):
    @settings(max_examples=examples(backend))
    @given(shape=SHAPES, p=st.sampled_from((0.1, 0.5, 0.9)),
           c=st.sampled_from((1.0, -3.0, 0.25)), deep=st.booleans(), seed=st.integers(0, 99))
    def prop(shape, p, c, deep, seed):
        torch._dynamo.reset()

        def f(x):  # `deep`: the mask is applied to a value the backward may recompute
            h = torch.tanh(x) + 2.0 if deep else x
            return F.dropout(h, p) * c
        x = torch.randn(shape, dtype=torch.float64).float()
        compiled = trainc.compile(f, backend=backend, memory_budget=budget)
        y, grad = _run(compiled, x, seed)
        keep = y != 0
        local = (1 - torch.tanh(x) ** 2) if deep else torch.ones_like(x)
        torch.testing.assert_close(grad, keep * local * c / (1 - p), rtol=1e-5, atol=0)
        assert torch.equal(grad != 0, keep), "grad is nonzero exactly where forward kept"
        y2, grad2 = _run(compiled, x, seed)
        assert bitwise_equal(y, y2) and bitwise_equal(grad, grad2), "same seed, different bits"
    prop()


def test_dropout_masks_differ_between_calls():
    """Consecutive calls draw fresh seeds: the masks must not repeat."""
    torch._dynamo.reset()
    compiled = trainc.compile(lambda x: F.dropout(x, 0.5), backend="aten")
    x = torch.ones(256)
    torch.manual_seed(0)
    assert not torch.equal(compiled(x) != 0, compiled(x) != 0)
