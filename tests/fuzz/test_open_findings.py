"""Open fuzz findings (nightly, 2026-11-30, seed base 20261200), each a runnable program file in
findings/ (program, make_inputs, OPTS = the failing compile options). Each test asserts the
mismatch is still there, so it fails once the bug is fixed: then move it to test_regressions.py."""
import os
import runpy

import pytest

from trainc.codegen import BACKENDS
from trainc.testing import assert_grads_match

HERE = os.path.join(os.path.dirname(__file__), "findings")
OPEN = {  # file: what is wrong, as far as diagnosed
    "programs_nodrop_aten_None_20261221": "x0 @ x0.T twice, CSE'd: backward sums the tangents "
    "before one mm, eager after two; with -inf in x0 one order gives NaN, the other not",
    "programs_nodrop_cpp_None_20261224": "float32 output/grad error 8x eager's (5e-5 vs 6e-6)",
    "programs_nodrop_triton_0_5_20261236": "NaN positions differ (index_put over rsqrt/log1p "
    "of +-inf, budget 0.5)",
    "programs_nodrop_triton_None_20261230": "float32 grad error 20x eager's (6.7e-4 vs 3.3e-5)",
    "programs_cpp_0_0_20261207": "WRONG GRADIENT (float64 err 0.23) for an expanded input "
    "(stride 0) under budget 0 on cpp",
}


@pytest.mark.parametrize("name", sorted(OPEN))
def test_open_finding(name):
    ns = runpy.run_path(os.path.join(HERE, name + ".py"))
    if ns["OPTS"]["backend"] not in BACKENDS:
        pytest.skip(f"backend {ns['OPTS']['backend']} not registered")
    # Fails once the bug is fixed (like xfail(strict)): then move it to test_regressions.py.
    with pytest.raises(AssertionError):
        assert_grads_match(ns["program"], ns["make_inputs"], **ns["OPTS"])
