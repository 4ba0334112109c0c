"""Fuzz findings of the nightly of 2026-11-30 (seed base 20261200), each a runnable program file
in findings/ (program, make_inputs, OPTS = the compile options that failed). FIXED ones must
pass; each OPEN one asserts its mismatch is still there, so it fails once the bug is fixed:
then move its entry to FIXED. UNREPLAYABLE ones were oracle artifacts: the replaying reference
must refuse them (UnreplayableDropout)."""
import os
import runpy

import pytest
import torch

from trainc.codegen import BACKENDS
from trainc.testing import ReplayFunctional, UnreplayableDropout, assert_grads_match
from trainc.testing.modules import replay_dropouts

HERE = os.path.join(os.path.dirname(__file__), "findings")
OPEN: dict[str, str] = {}  # file: what is wrong, as far as diagnosed
UNREPLAYABLE = {  # file: why the eager oracle cannot check it (trainc is not at fault)
    "programs_cpp_0_0_20261806": "(session 18 local nightly, bf16, 0-d inputs) v17 = "
    "F.dropout(v9, p=0.9), then v20 = v17.flatten(); v20.add_(v9): the write through the view "
    "changes v17, the returned output, after the dropout. The compiled run dropped it (0 + v9); "
    "the replay read the nonzero output as kept (11 v9 against v9: err 0.909). v17 is 1-d, so "
    "flatten() returned v17 itself (no _base) and the generator took v20 for a new value. "
    "Now the generator freezes any value sharing a frozen one's storage, and the replay "
    "refuses dropout outputs written in place later (ReplayFunctional.check_unmutated)",
    "modules_cpp_None_20261016": "(session 10/11 local nightly, module stacks) bf16 "
    "Conv2d(4,4,3) + residual, Flatten, Dropout(0.1), BatchNorm1d(100) over a batch of 4, "
    "three Linears: the input's and the conv weight's gradients had 5x eager's error. Cause "
    "(session 15): one of the Dropout's bf16 inputs is exactly 0, so the compiled output hides "
    "its mask there; the replaying reference took it as dropped, trainc had kept it (forcing "
    "that mask to 1 in the reference passes). ReplayDropout now refuses such masks",
    "modules_cpp_0_5_20261421": "(session 14 local nightly of module stacks) bf16 Conv2d(3,4) "
    "and a residual Conv2d(4,4), Dropout(0.5), SiLU, BatchNorm2d(4), a residual Conv2d: "
    "m1.weight's gradient had 3.6x eager's error. Cause (session 15): one of the 300 bf16 "
    "values entering the Dropout is exactly 0 (the float64 value is 1.7e-4), as above",
}
EAGER_INEXACT = {  # file: why the float64 eager reference, not trainc, is off
    "programs_nodrop_cpp_None_34001_39": "(session 22, broadened fuzz, seed 34001) float64 "
    "F.hardsigmoid: ATen's CPU hardsigmoid_backward multiplies by (1.0f / 6.0f), a float32 "
    "constant, so eager float64 is 3e-8 off; trainc's decomposed t * (1 / 6) is exact "
    "(test_eager_float64_hardsigmoid_backward_is_inexact). The generator no longer draws "
    "hardsigmoid in float64 programs (compositions.FLOAT64_INEXACT)",
}
FIXED = {
    "programs_cpp_None_3601": "(session 36 review, written by hand) float32, cpp: var_mean "
    "and BatchNorm statistics of values near 1e19 that differ by multiples of 2^40: cpp's "
    "variance was 33% off (the float32 deviations lose their low bits), eager's is exact "
    "(its CPU kernels accumulate in double). Fixed: var_mean of CPU float32 and 16-bit "
    "tensors from a float64 variance (decomps._cpu_std), as var / std",
    "programs_cpp_0_5_3302": "(session 33 local nightly, seed 3301) float32, cpp, budget "
    "0.5: var over rows of values near 1e19 was inf at 3 elements where eager's is finite "
    "(the squares' float32 sum overflows; eager's CPU kernel accumulates in double). Fixed: "
    "var of CPU float32 and 16-bit tensors from a float64 variance (decomps._cpu_std)",
    "programs_cpp_0_0_3303": "(session 33 local nightly, seed 3301) bf16, cpp, budget 0: "
    "F.normalize and std over rows holding +inf and 1e30: std was inf where eager's is 4.48e29 "
    "(every backend, aten too), and the input's gradient 3x eager's error. The traced std "
    "squared (x - mean) in float32, where 1e60 overflows; eager's CPU kernel accumulates in "
    "double. Fixed: std / std_mean of CPU float32 and 16-bit tensors from a float64 variance "
    "(decomps._cpu_std), as eager",
    "zoo_cpp_None_34102_69": "(session 22 zoo-stack fuzz, seed 34102) float32 ReLU, "
    "BatchNorm2d(1), two conv-BN-act over 4x1x8x8, pooled: cpp's m2.1.bias gradient was "
    "4.3e-4 off where eager is 4.7e-5. The backward graph alone, on the same inputs, in float64, "
    "aten float32 and cpp: every cpp sum was ~10x aten's error (sum_1 4.7e-7 vs 4.5e-8), and "
    "the BN backward's cancelling sums amplified it. Cause: float accumulators that take one "
    "8-wide simd block after another drift by up to n ulps (eager's cascade sum: a few). "
    "Fixed (session 23): float sums accumulate in double (cpp reductions.acc_ctype)",
    "programs_nodrop_cpp_0_0_fuse": "(found by a helper's fuzz run, session 3) var over 48 "
    "values near -50 that differ by ~0.01 (v11 - v6 with v6 a sum): ill-conditioned in float32; "
    "cpp's vectorized sum rounds v6 differently from eager and the grad's error is 2.1x eager's "
    "(2.57e-4 vs 1.21e-4; aten passes). The conditioning estimate cannot see it: moving the "
    "inputs moves v11 and v6 together; the cancellation is of a rounded intermediate. Moving "
    "each intermediate by one unit roundoff (session 8) is not enough either: a 48-term sum "
    "carries several of its result's roundings. Passes since session 22: the largest error of "
    "five emulated float32 evaluations (check._emulated_spread) is eager-sized or more",
    "modules_triton_0_5_20261908": "(session 19 local nightly, module stacks; the family of "
    "modules_cpp_0_0_20262302) three float32 BatchNorm2d(4) on a batch of 2 at 1x1: each BN "
    "normalizes the previous one's scale away, so m0.weight's gradient is 0 in float64 and "
    "rounding noise in float32: eager 1.36e-3, trainc 8.49e-3 on every backend (aten, cpp, "
    "triton) and budget, and at the commit before the session's changes: the traced, "
    "decomposed BN backward. The conditioning runs (inputs and intermediates moved by one "
    "unit roundoff) do not see this draw's noise. Passes since session 22: five emulated float32 "
    "evaluations (check._emulated_spread) see noise of the same size",
    "zoo_cpp_None_34102_43": "(session 22 zoo-stack fuzz, seed 34102; eager's conditioning) "
    "bf16 channels-last MobileNet block: depthwise conv-BN-SiLU, squeeze-excitation, inverted "
    "residual with ReLU6. m4.0.1.weight's gradient: trainc 0.52 (aten backend too, both "
    "layouts), eager 0.05; float32 eager 3e-6. Valid bf16 evaluations (float64 with every op "
    "rounded to bf16, nudged under one unit roundoff) land 0.05-5.2 away: BN outputs near "
    "ReLU6's 0 flip with the rounding. The conditioning estimate now includes the largest "
    "error of five such runs (check._emulated_spread)",
    "programs_nodrop_cpp_None_34001_36": "(session 22, broadened fuzz, seed 34001; a policy "
    "limit) float64 sin(lerp(x * x, x, 0.3)) with x ~ 1e19: arguments ~1e38, where one ulp of "
    "the argument is ~1e22 radians; trainc's lerp rounds one ulp from eager's and sin lands "
    "anywhere (0.2 relative). The float32 run's error (0.42) had saturated, and scaled by "
    "2^-29 it claimed float64 could be 8e-10 off; a float32 error above 0.1 is now used "
    "unscaled (check._SATURATED)",
    "modules_aten_0_5_20261713": "(local nightly, session 3) bf16 Conv-BN-Conv-BN on a batch "
    "of 2 at 1x1: the second BN cancels the first BN's parameters' gradients (float64: 1e-16 "
    "and ~1e-2), so they are rounding noise: eager's error 0.43, trainc's 12-17 on every "
    "backend and budget. Passes since session 8: with two sign draws, the intermediate-rounding "
    "conditioning runs find m0.weight's gradient ill-conditioned (one draw said 0.26)",
    "programs_cpp_None_20268300": "(session 8 local nightly; a policy limit) tanh(x) - "
    "erf(tanh(x)) cancels 300-fold; cpp's erf is 1.5 ulp off (eager's 0.2): 3.45e-5 vs eager's "
    "3.5e-6. Passes with the intermediate-rounding conditioning runs, which take two sign draws: "
    "one draw moved both terms alike (1.2e-6)",
    "modules_cpp_0_0_20262302": "(session 5 local nightly, module stacks; the same family as "
    "modules_aten_0_5_20261713) three BatchNorm2d(1) on a batch of 2 at 1x1, then a residual "
    "conv: each BN normalizes the next one's scale away, so the first two BNs' weight "
    "gradients are exactly 0 in float64 and rounding noise in float32: eager 7.1e-4, trainc "
    "3.1e-3 (aten backend too: the decomposed BN backward; channels-last and budget play no "
    "part). Passes since session 8: the conditioning estimate also moves every intermediate "
    "result by one unit roundoff (check._RoundEachOp), which sees the noise",
    "modules_cpp_None_20262600": "(session 6 local nightly, module stacks; the same family) "
    "float32 BatchNorm2d(3) then BatchNorm2d(3) then a 1x1 conv: the second BN normalizes the "
    "first one's scale away, so m0.weight's gradient is exactly 0 in float64 and rounding "
    "noise in float32: eager 1.8e-5, cpp 1.2e-4 (cpp's vectorized sums round in another order; "
    "aten passes). Passes since session 8 (intermediates moved in the conditioning runs)",
    "programs_triton_0_5_20261901": "(session 4 local nightly; a policy limit) exp(3.5 * a sum "
    "of squares) overflows float32 to +inf, so gelu(log(inf + 1)) ** 2 is NaN in eager (CPU "
    "float32 gelu(+inf)) and +inf in trainc (cpp and triton) where float64 is finite. Where "
    "only eager is NaN, a non-NaN compiled value whose infinity points the reference's way "
    "now passes",
    "programs_nodrop_cpp_None_20261224": "(a policy limit, not a codegen bug) sin(sum(2.5 x) ** "
    "3) in float32: ill-conditioned, another summation order is 8x eager's error (5e-5 vs "
    "6e-6). The measured conditioning (one unit roundoff of the inputs moves it 2.6e-5) now "
    "allows for it",
    "programs_nodrop_triton_None_20261809": "(session 3 final local nightly; a policy limit, "
    "not a codegen bug) x1's gradient sums sign(x1) * t0 + erf'(x1) * t1 = 1.427 - 1.434: a "
    "200-fold cancellation; triton's exp rounds one ulp from eager's and the sum lands two "
    "ulps of the terms away (3.7e-5 relative vs eager's lucky 4.1e-6). The policy now measures "
    "each value's conditioning (check._conditioning) and allows for it",
    "programs_triton_0_0_20261616": "(session 3 GPU-host nightly, triton and cpp at budget 0) "
    "a saved value traced as an expand but stored densely because an extern read it: the "
    "backward wanted (0, 1) and got (5, 1). Outputs now keep the traced stride-0 dims as a view",
    "programs_nodrop_triton_0_5_20261628": "(same nightly) as above with the other dims "
    "permuted: (400, 80, 20, 4, 1) where the backward wants (0, 80, 20, 1, 5); restride lays "
    "out the first slice and expands it",
    "programs_cpp_None_20261603": "(session 3 GPU-host nightly; an oracle bug) F.dropout "
    "returns an empty input itself, so a later in-place write that requires grad makes the "
    "dropout output require grad too; the oracle's dropout replay returned a new tensor",
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


def _subject(ns: dict):
    """A program finding's function, or a module-stack finding's model."""
    return ns["program"] if "program" in ns else ns["make_model"]()


def _check(name: str) -> None:
    """assert_grads_match on a finding; a program's dropouts (its last outputs, as the fuzz
    generator writes them) replay the compiled run's masks, as in the fuzz."""
    ns = _load(name)
    reference = None
    source = open(os.path.join(HERE, name + ".py")).read()
    n_drop = source.count("F.dropout(") if "program" in ns else 0
    if n_drop:
        body = source[source.index("def program"):source.index("def make_inputs")]

        def reference(outs):
            def replay(*args):
                env = {"torch": torch, "F": ReplayFunctional(list(outs[-n_drop:]))}
                exec(body, env)
                out = env["program"](*args)
                env["F"].check_unmutated()
                return out
            return replay
    subject = _subject(ns)
    if "make_model" in ns and any(isinstance(m, torch.nn.Dropout) for m in subject.modules()):
        reference = replay_dropouts(subject)
    assert_grads_match(subject, ns["make_inputs"], reference=reference, **ns["OPTS"])


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_finding(name):
    _check(name)


@pytest.mark.parametrize("name", sorted(UNREPLAYABLE))
def test_unreplayable_finding(name):
    with pytest.raises(UnreplayableDropout):
        _check(name)


@pytest.mark.parametrize("name", sorted(OPEN))
def test_open_finding(name):
    with pytest.raises(AssertionError):  # fails once fixed (like xfail(strict)): move to FIXED
        _check(name)



@pytest.mark.parametrize("name", sorted(EAGER_INEXACT))
def test_eager_inexact_finding(name):
    with pytest.raises(AssertionError):  # passes once eager's float64 kernel is exact
        _check(name)


def test_eager_float64_hardsigmoid_backward_is_inexact():
    """trainc's float64 hardsigmoid gradient is t / 6 exactly; eager's uses float32's 1/6."""
    import torch.nn.functional as F

    import trainc
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(64, generator=g, dtype=torch.float64)
    exact = torch.where(x.detach().abs() < 3, t * (1.0 / 6.0), 0.0)
    eager, = torch.autograd.grad(F.hardsigmoid(x), x, t)
    compiled, = torch.autograd.grad(trainc.compile(F.hardsigmoid, backend="aten")(x), x, t)
    torch._dynamo.reset()
    assert torch.allclose(compiled, exact, rtol=1e-15, atol=0)
    assert not torch.allclose(eager, exact, rtol=1e-10, atol=0)
