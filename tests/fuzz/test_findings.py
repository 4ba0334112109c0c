"""Fuzz findings of the nightly of 2026-11-30 (seed base 20261200), each a runnable program file
in findings/ (program, make_inputs, OPTS = the compile options that failed). FIXED ones must
pass; each OPEN one asserts its mismatch is still there, so it fails once the bug is fixed:
then move its entry to FIXED."""
import os
import runpy

import pytest

from trainc.codegen import BACKENDS
from trainc.testing import assert_grads_match

HERE = os.path.join(os.path.dirname(__file__), "findings")
OPEN = {  # file: what is wrong, as far as diagnosed
    "programs_nodrop_cpp_None_20261224": "sin(sum(2.5 x) ** 3) in float32: ill-conditioned, "
    "a different summation order is 8x eager's error (5e-5 vs 6e-6); the policy's one eager "
    "sample does not measure the conditioning",
}
FIXED = {
    "programs_nodrop_triton_0_5_20261441": "(session 3 nightly, 18 segfaults under the triton "
    "3.6 interpreter) softmax of an empty gather: the kernel loaded a zero-element buffer at "
    "a constant index, unmasked, out of bounds; such loads are now zeros of the block's shape",
    "programs_nodrop_aten_None_20261221": "x0 @ x0.T twice, CSE'd into one value the runtime "
    "returned as one tensor object twice: autograd summed the two tangents before the backward "
    "(inf vs NaN with -inf inputs; and the two outputs aliased). Duplicates are now cloned",
    "programs_triton_0_0_20261308": "(nightly of session 2, seed 20261308) a saved value traced "
    "as an expanded layout was computed dense by the forward; the backward, compiled for the "
    "expanded layout, could not take it. Such outputs are now computed once and returned "
    "expanded",
    "programs_nodrop_triton_0_5_20261236": "triton log1p(+inf) gave NaN",
    "programs_nodrop_triton_None_20261230": "triton tanh was up to 5 ulp off in float32; its "
    "backward (1 - y^2) amplified that to 20x eager's grad error",
    "programs_cpp_0_0_20261207": "mean computed as sum * (1/n): the mean of 15 equal values "
    "was not exactly that value, so maximum(x, x.mean()) lost its tie and routed the whole "
    "gradient to one side (float64 err 0.23); now sum / n as eager",
}


def _load(name: str) -> dict:
    ns = runpy.run_path(os.path.join(HERE, name + ".py"))
    if ns["OPTS"]["backend"] not in BACKENDS:
        pytest.skip(f"backend {ns['OPTS']['backend']} not registered")
    return ns


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_finding(name):
    ns = _load(name)
    assert_grads_match(ns["program"], ns["make_inputs"], **ns["OPTS"])


@pytest.mark.parametrize("name", sorted(OPEN))
def test_open_finding(name):
    ns = _load(name)
    with pytest.raises(AssertionError):  # fails once fixed (like xfail(strict)): move to FIXED
        assert_grads_match(ns["program"], ns["make_inputs"], **ns["OPTS"])
