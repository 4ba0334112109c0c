"""Random nn.Module stacks: outputs, parameter and input grads, buffers vs eager."""
import pytest
from hypothesis import given, settings

from fuzz_helpers import combos, examples, run_check
from trainc.testing import module_stacks, zoo_stacks

COMBOS = combos()


@pytest.mark.parametrize("backend,budget", COMBOS)
def test_module_stacks_match_eager(backend, budget):
    @settings(max_examples=examples(backend, budget=budget))
    @given(stack=module_stacks())
    def prop(stack):
        run_check(stack, backend, budget)
    prop()


@pytest.mark.parametrize("backend,budget", COMBOS)
def test_zoo_stacks_match_eager(backend, budget):
    """CNN blocks of the zoo models (inverted residuals, squeeze-excitation, depthwise convs,
    BatchNorm over tiny maps, channels-last), train mode."""
    @settings(max_examples=examples(backend, 0.5, budget))
    @given(stack=zoo_stacks())
    def prop(stack):
        run_check(stack, backend, budget)
    prop()
