"""trainc.testing: hypothesis strategies for training programs, and `assert_grads_match`.

    from hypothesis import given
    from trainc.testing import assert_grads_match, module_stacks, programs

    assert_grads_match(fn, [x, w], backend="cpp", memory_budget=0.5)  # DESIGN.md's policy

    @given(programs())            # random op DAGs; repr(prog) is runnable Python source
    def test_mine(prog):
        prog.check(backend="cpp")  # assert_grads_match with dropout masks replayed

    bisect(fn, [x, w], backend="cpp")  # a failing case -> the first stage that fails, a repro

A value that fails gets a second opinion before it is reported (second.py): other valid eager
evaluations (channels-last, one thread), and float64 with inputs that sit within rounding of a
clamp/ReLU/max cutoff flipped (flips.py); values excused so come back as notes, not failures.

`module_stacks()` draws nn.Module stacks the same way (`stack.check(...)`); `zoo_stacks()` draws
small CNNs from the blocks zoo models are made of (inverted residuals, squeeze-excitation, ...).
"""
from trainc.testing.bisect import BisectResult, Stage, bisect
from trainc.testing.check import assert_grads_match
from trainc.testing.modules import ModuleStack, module_stacks
from trainc.testing.policy import TOLERANCES, Mismatch, bitwise_equal, compare, rel_err
from trainc.testing.programs import (InputSpec, Program, ReplayFunctional, UnreplayableDropout,
                                     programs)
from trainc.testing.zoo_stacks import zoo_stacks

__all__ = ["assert_grads_match", "bisect", "BisectResult", "Stage", "programs", "module_stacks", "zoo_stacks", "Program", "ModuleStack",
           "InputSpec", "ReplayFunctional", "UnreplayableDropout", "Mismatch", "TOLERANCES",
           "compare", "rel_err", "bitwise_equal"]
