"""Ops printed through libdevice on GPU (pow with a tensor exponent, tan, sinh, cosh, erfc, atan,
asin, acos) also
run under TRITON_INTERPRET, where the prelude's tl-primitive stand-ins replace libdevice."""
import pytest
import torch

from triton_helpers import DEVICE, assert_same, check, compile_triton


def test_pow_with_tensor_exponent_special_cases():
    a = torch.tensor([0.9, 2.0, -2.0, 0.0, -2.0, 1.0, float("nan"), 3.0, 0.0], dtype=torch.float64)
    b = torch.tensor([3.0, 0.5, 3.0, 2.0, 0.5, float("nan"), 0.0, -2.0, -1.0],
                     dtype=torch.float64)
    check(lambda a, b: (torch.pow(a, b), torch.pow(a.float(), b.float())), a, b)


def test_hyperbolic_and_tan_and_erfc():
    x = torch.linspace(-1.2, 1.2, 13)
    check(lambda x: (torch.tan(x), torch.sinh(x), torch.cosh(x), torch.erfc(x)), x)


def test_inverse_trigonometric_with_special_values():
    """atan / asin / acos (the interpreter lacked all three: the nightly fuzz's
    programs-triton-0.0-3306 failed in a kernel with atan) across the reductions' ranges, at
    +-0, +-1, +-inf, NaN and out of domain, in float32 and float64."""
    x = torch.tensor([-30.0, -2.5, -1.0, -0.41, -0.0, 0.0, 1e-30, 0.19, 0.21, 0.42, 1.0, 7.0,
                      1e30, float("inf"), -float("inf"), float("nan")], dtype=torch.float64)
    u = torch.tensor([-1.0, -0.999999, -0.5, -0.0, 0.0, 1e-30, 0.3, 0.9999999, 1.0, 1.5, -2.0,
                      float("nan")], dtype=torch.float64)
    for dt in (torch.float32, torch.float64):
        check(lambda x, u: (torch.atan(x), torch.asin(u), torch.acos(u)), x.to(dt), u.to(dt))
    y = torch.atan(torch.tensor([-0.0], device=DEVICE))
    assert compile_triton(torch.atan, y).run([y.clone()])[0].signbit().all()


@pytest.mark.parametrize("precise", [False, True])
def test_float32_division_fast_or_ieee(precise):
    """Config.triton_precise_div: Triton's `/` (div.full.f32, within 2 ulp; the default) or
    tl.div_rn. Either way NaN/Inf land where eager's are, huge denominators and subnormal
    quotients stay right (natively on the GPU; the interpreter divides exactly)."""
    a = torch.tensor([1.0, -3.0, 0.0, float("inf"), 1.0, 7.0, 1e-38, 3e38, float("nan"), 2.0,
                      -0.0, 5.0])
    b = torch.tensor([3.0, 0.0, 0.0, float("inf"), 3e38, -2e38, 10.0, 0.5, 1.0, 1.5e-38,
                      4.0, -1e-3])
    fn = lambda a, b: (a / b, torch.reciprocal(b), b ** -1, b ** -2)
    args = [a.to(DEVICE), b.to(DEVICE)]
    c = compile_triton(fn, *args, triton_precise_div=precise)
    assert ("tl.div_rn" in c.extra["triton"]) == precise
    for o, r in zip(c.run(list(args)), fn(*args)):
        assert_same(o, r, 2.5e-7, 1e-44, "quotient")


def test_quotient_rounded_or_compared_is_ieee():
    """Fast division stays out of floor/ceil/round/int casts and comparisons: floor(0.3 / 0.1)
    one ulp low is 2 instead of 3 (eager: 2, as IEEE 0.3f / 0.1f = 2.9999998 -> exact here)."""
    a = torch.tensor([0.3, 6.0, 0.7, 1.0, 5.0])
    b = torch.tensor([0.1, 3.0, 0.1, 3.0, -1e-3])
    fn = lambda a, b: ((a / b).floor(), (a / b).ceil(), (a / b).long(), a / b > 3.0)
    args = [a.to(DEVICE), b.to(DEVICE)]
    c = compile_triton(fn, *args, triton_precise_div=False)
    src = c.extra["triton"]
    assert "tl.div_rn" in src and " / " not in src.split("def kernel")[1]
    for o, r in zip(c.run(list(args)), fn(*args)):
        assert torch.equal(o, r), (o, r)


def test_mean_divides_exactly_so_ties_with_it_hold():
    """mean = sum / n keeps IEEE division with fast division on: 15 equal values (their sum
    exact) average to exactly that value, so maximum(x, x.mean()) ties everywhere and its
    gradient splits evenly (findings/programs_cpp_0_0_20261207 on cpp). As CPU eager; CUDA
    eager's mean multiplies by 1/n (0.75 * 15 * (1/15) is 0.75000006), so compare to the
    exact values, not to eager."""
    x = torch.full((15,), 0.75, device=DEVICE)
    fn = lambda x: (torch.maximum(x, x.mean()), x.mean())
    c = compile_triton(fn, x, triton_precise_div=False)
    assert " / " not in "".join(c.extra["triton"].split("def kernel")[1:])
    top, mean = c.run([x])
    # (a CPU var is computed in float64, as eager's CPU kernel: its division is IEEE anyway)
    var, = compile_triton(lambda x: (x.var(),), x, triton_precise_div=False).run([x])
    assert torch.equal(top, x) and mean.item() == 0.75 and var.item() == 0.0


def test_division_by_a_power_of_two_is_a_multiply():
    """x / 2^k prints as x * 2^-k (the same correctly rounded value for every x, subnormal
    results, signed zeros, Inf and NaN included); other constant divisors stay divisions.
    Compared with CPU eager: CUDA eager divides by a Python scalar as a multiply by its
    reciprocal (x / 3.0 is then not correctly rounded; found natively on the H200)."""
    x = torch.tensor([1.0, -3.0, 0.0, -0.0, float("inf"), float("nan"), 3e38, 1e-38, 7e-45,
                      0.1, 2049.0, -5.5, 1.0, 2.0, 3.0, 4.0], device=DEVICE)  # 16: means
    h = x.to(torch.bfloat16)
    fn = lambda x, h: (x / 2048, x / -0.25, x / 2.0 ** 127, x / 3.0, x.sum() / 4,
                       h.mean(), h / 8)
    c = compile_triton(fn, x, h, triton_precise_div=True)
    src = "".join(c.extra["triton"].split("def kernel")[1:])
    assert src.count("tl.div_rn") == 1, src  # x / 3.0 only
    for o, r in zip(c.run([x, h]), fn(x.cpu(), h.cpu())):
        o = o.cpu()
        assert torch.equal(o.isnan(), r.isnan()) and torch.equal(o[~o.isnan()], r[~r.isnan()])
        assert torch.equal(o.signbit()[~r.isnan()], r.signbit()[~r.isnan()])  # signed zeros


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_division_natively_on_gpu():
    """The two division tests above, with Triton's native instructions (run with -m gpu and
    TRITON_INTERPRET=0; the interpreter divides exactly)."""
    for precise in (False, True):
        test_float32_division_fast_or_ieee(precise)
    test_quotient_rounded_or_compared_is_ieee()
    test_mean_divides_exactly_so_ties_with_it_hold()
    test_division_by_a_power_of_two_is_a_multiply()


def test_bfloat16_subnormals_load_and_round_exactly():
    """bfloat16 loads widen and results round by their bits under the interpreter (its own
    casts read 1e-38 as 8.3e-39 and flush small results): CPU tests see what the GPU computes."""
    h = torch.tensor([1e-38, 3e-39, 2e-39, 9e-41, -1e-38, 1.0, float("inf"), float("nan")],
                     dtype=torch.bfloat16, device=DEVICE)
    fn = lambda h: (h * 3, h / 3, h.float() * 0.5, (h.float() / 7).bfloat16())
    c = compile_triton(fn, h)
    for o, r in zip(c.run([h]), fn(h)):
        assert torch.equal(o.isnan(), r.isnan()) and torch.equal(o[~o.isnan()], r[~r.isnan()]), \
            (o, r)
