"""Random training programs: outputs, grads, NaN/Inf positions and run-to-run bits vs eager."""
import pytest
from hypothesis import given, settings

from fuzz_helpers import combos, examples, run_check
from trainc.testing import programs

COMBOS = combos()


@pytest.mark.parametrize("backend,budget", COMBOS)
def test_programs_match_eager(backend, budget):
    @settings(max_examples=examples(backend, 2.0, budget))
    @given(prog=programs())
    def prop(prog):
        run_check(prog, backend, budget)
    prop()


@pytest.mark.parametrize("backend,budget", COMBOS)
def test_programs_without_dropout_match_eager(backend, budget):
    """Dropout-free programs: every comparison is against true eager, nothing replayed."""
    @settings(max_examples=examples(backend, budget=budget))
    @given(prog=programs(dropout=False, max_ops=12))
    def prop(prog):
        run_check(prog, backend, budget)
    prop()
