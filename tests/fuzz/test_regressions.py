"""Failures the fuzzer found, shrunk. xfail(strict) until fixed: then delete the marker."""
import pytest
import torch

import trainc

from trainc.codegen import BACKENDS
from trainc.testing import InputSpec, Program, assert_grads_match


def test_gather_with_empty_constant_index_inference():
    """Was a fuzz failure; fixed."""
    def program(x0):
        return (torch.gather(x0, 0, torch.tensor([], dtype=torch.long).reshape(0, 0)),)
    assert_grads_match(program, [torch.randn(1, 1)], backend="aten")


def test_gather_with_constant_index_training():
    """Was: partition cost model had no entry for get_attr constants (KeyError)."""
    def program(x0):
        return (torch.gather(x0, 0, torch.tensor([0], dtype=torch.long)),)
    assert_grads_match(program, [torch.randn(2, requires_grad=True)], backend="aten")


def test_constant_index_on_input_without_grad_training():
    """Was: partition memory simulation had no cost entry for a get_attr constant (KeyError)."""
    def program(x0, x1):
        return (x1 * 2, x0[torch.tensor([0, 0])])
    assert_grads_match(program, [torch.randn(2), torch.randn(2, 2, requires_grad=True)],
                       backend="aten")


needs_cpp = pytest.mark.skipif("cpp" not in BACKENDS, reason="cpp backend not registered")


@needs_cpp
def test_cpp_reduction_over_dim_of_0d_tensor():
    """Was: cpp reduce() indexed x.shape[d] with a 0-d tensor's unnormalized dim."""
    def program(x0):
        return (x0.sum(0, keepdim=True),)
    assert_grads_match(program, [torch.randn((), requires_grad=True)], backend="cpp")


@needs_cpp
def test_cpp_expanded_output():
    """Was: runtime copied a cpp output into overlapping empty_strided (copy_ refused)."""
    def program(x0):
        return ((x0 + 1.5).expand(2, -1, -1),)
    assert_grads_match(program, [torch.randn(3, 2, requires_grad=True)], backend="cpp")



def test_view_as_complex_output():
    """Was: a silent wrong answer: the dtype-changing view of an input came back as float32
    through as_strided on the float base, with a wrong gradient."""
    def program(x0):
        return (torch.view_as_complex(x0),)
    for backend in ("aten", "cpp"):
        assert_grads_match(program, [torch.randn(3, 2, requires_grad=True)], backend=backend)


@needs_cpp
def test_cpp_complex_intermediate():
    """Was: cpp backend raised KeyError torch.complex64."""
    def program(x0):
        return (torch.view_as_complex(x0 * 2).abs(),)
    assert_grads_match(program, [torch.randn(3, 2, requires_grad=True)], backend="cpp")



def test_complex_output_keeps_grad():
    """Was: torch.complex(re, im) came back with requires_grad=False and no gradient."""
    def program(re, im):
        return (torch.complex(re, im),)
    g = torch.Generator().manual_seed(0)
    assert_grads_match(program, [torch.randn(3, generator=g).requires_grad_(),
                                 torch.randn(3, generator=g).requires_grad_()], backend="aten")


def test_soft_margin_loss_grad_precision():
    """Was: the backward decomposed to y * g * (sigmoid(y * x) - 1): 13% error (cancellation)."""
    def program(x, y):
        return (torch.nn.functional.soft_margin_loss(x, y),)
    for backend in ("aten", "cpp"):
        assert_grads_match(program, [torch.tensor(-8.4784, requires_grad=True),
                                     torch.tensor(-1.7658)], backend=backend)
        assert_grads_match(program, [torch.randn(4, 5, requires_grad=True),
                                     torch.randn(4, 5).sign()], backend=backend)


def test_index_put_with_bool_mask_is_a_clear_error():
    """Was: DynamicOutputShapeException from deep inside make_fx. Its backward formula indexes
    with the mask (nonzero): data-dependent shapes are refused with a trainc error."""
    def program(x, v):
        return (torch.index_put(x, (x > 0,), v),)
    g = torch.Generator().manual_seed(0)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="trainc: .*data-dependent output shape"):
        trainc.compile(program, backend="aten")(torch.randn(4, 3, generator=g).requires_grad_(),
                                                torch.randn((), generator=g).requires_grad_())



@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not registered")
def test_triton_bf16_dropout():
    """Was a fuzz failure: the interpreter mis-casts bool -> bf16 (the keep mask); fixed."""
    prog = Program(torch.bfloat16, (InputSpec((3, 11)),), ("v0 = F.dropout(x0, p=0.1)",),
                   ("v0",), 1, 0)
    prog.check(backend="triton")



@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not registered")
def test_triton_rounds_float32_to_bfloat16_to_nearest_even():
    """Was a fuzz failure (bf16 program 1 ulp off): the interpreter truncates float32 -> bf16
    where native Triton rounds to nearest even; the generated code now rounds explicitly."""
    torch._dynamo.reset()
    x = torch.tensor([1 + 2 ** -8 + 2 ** -12, -0.91756, 1 + 2 ** -8, float("nan"), 3e38])
    y = trainc.compile(lambda t: (t * 1.0).to(torch.bfloat16), backend="triton")(x)
    assert torch.equal(y[:3], x[:3].bfloat16()) and torch.isnan(y[3])
    assert torch.equal(y[4:], x[4:].bfloat16())


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not registered")
def test_triton_index_value_over_size_one_range():
    """Was a fuzz failure: an arange over a size-1 dim printed `(0).to(tl.int64)`."""
    torch._dynamo.reset()
    x = torch.randn(1, 3)
    f = trainc.compile(lambda t: t + torch.arange(t.shape[0]).unsqueeze(1), backend="triton")
    torch.testing.assert_close(f(x), x + torch.arange(1).unsqueeze(1))


@pytest.mark.parametrize("backend", [b for b in ("cpp", "triton") if b in BACKENDS])
def test_bf16_amax_backward_sees_the_rounded_values(backend):
    """Was a fuzz failure (grad err 1.0): var computed in float32 inside a kernel, amax stored
    rounded to bf16, so amax backward's `var == amax` matched nothing. Lowered bf16 values are
    now rounded at every node, as eager rounds every op."""
    def program(x0):
        return ((x0 * 1.37).var(1).amax(1, keepdim=True),)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 5, 5, generator=g).bfloat16().requires_grad_()
    assert_grads_match(program, [x], backend=backend)


@pytest.mark.parametrize("backend", [b for b in ("cpp", "triton") if b in BACKENDS])
def test_var_of_one_element_is_nan(backend):
    """Was a fuzz failure: g++ contracted x*x - mean into an FMA, so the variance of one
    element (0/0 = NaN in eager) came out inf; cpp flags now include -ffp-contract=off."""
    torch._dynamo.reset()
    x = torch.randn(4, 1)
    assert torch.isnan(trainc.compile(lambda t: (t * t).var(1), backend=backend)(x)).all()


@pytest.mark.skipif("triton" not in BACKENDS, reason="triton backend not registered")
def test_triton_tanh_and_sign_of_infinity():
    """Were fuzz failures: tanh(+-inf) and the abs backward's sign(+-inf) gave NaN."""
    def program(x0):
        return (torch.tanh(x0), torch.sqrt(x0.abs() + 1))
    x = torch.tensor([float("-inf"), float("inf"), 0.5, -30.0], dtype=torch.float64)
    assert_grads_match(program, [x.requires_grad_()], backend="triton")


@pytest.mark.parametrize("backend", [b for b in ("cpp", "triton") if b in BACKENDS])
def test_sign_of_nan_is_zero(backend):
    """Was a fuzz failure: abs backward at NaN (torch.sign(nan) = 0) gave NaN."""
    def program(x0, x1):
        return (x0.abs() + x1,)
    x = torch.tensor([float("nan"), -0.0, 2.0], dtype=torch.float64)
    assert_grads_match(program, [x.requires_grad_(), torch.ones(3, requires_grad=True,
                                                                dtype=torch.float64)],
                       backend=backend)


def test_narrow_with_tensor_start_is_a_clear_refusal():
    """Was an OpInfo sweep failure: a raw DataDependentOutputException from the analysis."""
    torch._dynamo.reset()
    f = trainc.compile(lambda x, s: x.narrow(0, s, 2), backend="aten")
    with pytest.raises(trainc.UnsupportedError, match="data-dependent"):
        f(torch.randn(4, requires_grad=True), torch.tensor(1))


@needs_cpp
def test_cpp_aten_result_with_other_strides_on_size_one_dims():
    """Was a fuzz failure (nightly, cpp): an mm result of shape (4, 1) came back with strides
    (0, 1) where the trace said (0, 0); the wrapper copied it into an overlapping layout
    ("more than one element of the written-to tensor..."). Size-1 dims never index."""
    def program(x0, x1):
        v6 = (x0 @ x1) / (x1[:, ::3].abs() + 1)
        return (torch.logsumexp(v6, -2, keepdim=True),)
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(1, generator=g).expand(4).requires_grad_()
    assert_grads_match(program, [x0, torch.randn(4, 3, generator=g, requires_grad=True)],
                       backend="cpp", memory_budget=0.5)


@needs_cpp
def test_cpp_bf16_log_softmax_of_0d_tensor():
    """Was a fuzz failure (helper, seed 14802): 0.2207 where eager gives 0; fixed by rounding
    lowered bf16 values at every node."""
    def program(x0, x1):
        v1 = torch.tanh(2 * x1 / (x0.abs() + 1))
        ls = torch.log_softmax(v1, 0)
        return (torch.where(ls > 0, v1, ls),)
    g = torch.Generator().manual_seed(14802)
    x0, x1 = (torch.randn((), generator=g, dtype=torch.float64).bfloat16() for _ in range(2))
    assert_grads_match(program, [x0, x1.requires_grad_()], backend="cpp")


@needs_cpp
def test_cpp_cummax_of_0d_tensor():
    """Was an OpInfo sweep failure: scatter_add of a 0-d tensor (cummax backward) indexed a
    dim it does not have; now an ATen fallback."""
    assert_grads_match(lambda x: torch.cummax(x, 0)[0], [torch.tensor(3.0, requires_grad=True)],
                       backend="cpp")


@needs_cpp
def test_cpp_softmax_of_0d_tensor():
    """Was a fuzz failure; fixed."""
    def program(x0):
        return (torch.softmax(x0, -1),)
    assert_grads_match(program, [torch.randn((), requires_grad=True)], backend="cpp")


@needs_cpp
@pytest.mark.parametrize("shape,dim", [((4096,), 0), ((512, 64), 0), ((64, 512), 1),
                                       ((300000,), 0)])
def test_cpp_float32_sums_round_once(shape, dim):
    """Finding zoo_cpp_None_34102_69: float accumulators drifted by up to n ulps (10x eager's
    error after a BatchNorm backward cancelled). A double accumulator rounds the sum of
    float32 values of one sign and similar size once: the float64 sum, rounded (row, column
    lanes, and a long split reduction)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from trainc import decomps
    from trainc.codegen.cpp import CppBackend
    g = torch.Generator().manual_seed(0)
    x = 1 + torch.rand(shape, generator=g)
    exact = x.double().sum(dim).float()
    gm = make_fx(lambda a: (a.sum(dim),), decomposition_table=decomps.TABLE,
                 tracing_mode="fake")(x)
    got, = CppBackend().compile(gm, [None]).run([x])
    if shape == (300000,):  # split: per-thread partials are stored as float32, then summed
        assert (got.double() - exact.double()).abs().max() <= 2 * torch.finfo().eps * exact.double()
    else:
        assert torch.equal(got, exact)


def test_every_known_bug_has_an_xfail_regression_test():
    from fuzz_helpers import KNOWN_BUGS
    for name in KNOWN_BUGS:
        marks = [m.name for m in getattr(globals().get(name), "pytestmark", [])]
        assert "xfail" in marks, f"KNOWN_BUGS[{name!r}] needs an xfail test of that name here"
