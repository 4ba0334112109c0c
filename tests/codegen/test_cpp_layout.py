"""C++ loop layout: column reductions vectorize across outer lanes, kernel-internal buffers live
in per-thread scratch, and both give eager's results (NaN, ties, odd sizes included)."""
import re

import pytest
import torch
import torch.nn.functional as F

from cpp_helpers import assert_same, check, compile_cpp


def _column_reductions(a, b):
    mx = a.max(0)
    return (a.sum(0), (a * b).sum(0), a.amax(0), a.amin(0), a.argmax(0), a.argmin(0),
            mx.values, mx.indices, a.prod(0), torch.softmax(a, 0), torch.logsumexp(a, 0),
            *torch.var_mean(a, 0), (a - a.mean(0, keepdim=True)) * b)


@pytest.mark.parametrize("shape,lanes", [((37, 64), True), ((3, 5, 48), True),
                                         ((9, 7), False), ((130, 40), True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_column_reductions_use_lanes(shape, lanes, dtype):
    a, b = torch.randn(*shape, dtype=dtype), torch.randn(*shape, dtype=dtype)
    a.view(-1)[::5] = a.view(-1)[1::5]  # ties: the first index wins
    c = check(_column_reductions, a, b, atol=1e-5)
    assert ("lane0" in c.extra["cpp"]) == lanes


def test_column_reductions_nan_and_inf():
    a, b = torch.randn(20, 32), torch.randn(20, 32)
    a[3, 5] = a[7, 9] = float("nan")
    a[2, 6] = float("inf")
    a[4, 6] = -float("inf")
    c = check(_column_reductions, a, b, atol=1e-5)
    assert "lane0" in c.extra["cpp"]


def test_column_reduction_bfloat16():
    a = torch.randn(33, 64, dtype=torch.bfloat16)
    c = check(lambda a: (a.sum(0), a.amax(0), a.float().sum(0)), a, rtol=1e-2, atol=1e-2)
    assert "lane0" in c.extra["cpp"]


def test_row_reductions_keep_the_inner_loop_vectorized():
    c = check(lambda a: (a.sum(1), torch.softmax(a, 1)), torch.randn(64, 96), atol=1e-5)
    assert "lane0" not in c.extra["cpp"] and "omp simd reduction" in c.extra["cpp"]


def _norm_act(x, w, b):
    y = F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)) + x
    return torch.softmax(y * 0.5, -1) * y


@pytest.mark.parametrize("shape", [(16, 40), (3, 4, 24)])
def test_kernel_internal_buffer_lives_in_scratch(shape):
    x, w, b = torch.randn(*shape), torch.randn(shape[-1]), torch.randn(shape[-1])
    c = check(_norm_act, x, w, b, atol=1e-5)
    assert len(c.kernels) == 1
    assert "_s[" in c.extra["cpp"]  # y is read by three later loops of the row
    assert c.kernels[0].bytes_written == x.numel() * 4  # only the output reaches memory


def test_scratch_in_lane_mode():
    def f(x):  # rows of x.t() are columns of x: lanes; y is reused by three later loops
        a = x.t()
        y = F.gelu(a) + a
        return torch.softmax(y * 0.5, -1).sum(-1), y.amax(-1), (y * torch.softmax(y, -1)).sum(-1)
    x = torch.randn(32, 24)
    x[3, 4] = float("nan")
    c = check(f, x, atol=1e-5)
    assert "lane0" in c.extra["cpp"] and "_s[" in c.extra["cpp"] and len(c.kernels) == 1


def test_large_rows_skip_scratch():
    x = torch.randn(2, 8192)
    c = check(_norm_act, x, torch.randn(8192), torch.randn(8192), atol=1e-5)
    assert "_s[" not in c.extra["cpp"]


def test_pointwise_inner_dims_flatten_when_contiguous():
    def f(x, w):
        return (x * w[None, :, None, None]).relu() + 1, x.transpose(2, 3) * 2
    x = torch.randn(4, 6, 8, 16)
    x[0, 1, 2, 3] = float("nan")
    c = check(f, x, torch.randn(6))
    src = c.extra["cpp"]
    assert "< 128; ++" in src  # the 8 x 16 plane runs as one vector loop; the channel stays
    assert "< 768; ++" not in src  # a merge that would make w's index non-affine is refused


def test_softmax_exp_is_computed_once_per_element():
    def f(x):
        return torch.softmax(x, -1), torch.log_softmax(x * 2, -1), torch.tanh(x).sum(-1)
    x = torch.randn(12, 96)
    x[1, 5], x[2, 7], x[3] = float("nan"), float("inf"), -float("inf")
    c = check(f, x, atol=1e-5)
    src = c.extra["cpp"]
    body = src[src.index('extern "C"'):]
    assert "rv0[" in body
    assert body.count("tc_exp(") == 2  # one per softmax: the sum loop's value is reused


def test_outputs_keep_the_traced_dense_layout():
    """A transposed/permuted output is computed in the traced layout, not contiguous: the
    backward's input check and the runtime's eager-layout outputs then copy nothing."""
    x = torch.randn(6, 5, 4)
    fns = [lambda a: ((a * 2).transpose(0, 1),), lambda a: (a.permute(2, 0, 1).exp(),)]
    for fn in fns:
        c = compile_cpp(fn, x)
        out, ref = c.run([x])[0], fn(x)[0]
        assert out.stride() == ref.stride() and out.stride() != out.contiguous().stride()
        assert_same(out, ref, 1e-6, 1e-6)


@pytest.mark.parametrize("shape,unrolled", [((32, 16), True), ((16, 3, 16), True),
                                            ((3, 5, 48), False), ((3, 64), False)])
def test_narrow_lane_reductions_keep_several_accumulator_sets(shape, unrolled):
    """Fewer than 64 lanes: the innermost reduced dim is split over independent accumulator
    sets (combined in order afterwards); same results as eager, NaN and infinities included."""
    a, b = torch.randn(*shape), torch.randn(*shape)
    a.view(-1)[::8] = a.view(-1)[1::8]  # ties
    a[0, ..., 2] = float("nan")
    a[1, ..., 3] = float("inf")  # with -inf below it: eager's var_mean is NaN there too
    a[2, ..., 3] = -float("inf")
    c = check(_column_reductions, a, b, atol=1e-5)
    src = c.extra["cpp"]
    assert "lane0" in src
    assert bool(re.search(r"\+= t\d+\[j\];", src)) == unrolled  # a set folded into set 0


def _channel_stats(a):
    m = a.amax(dim=(0, 1))
    return (*torch.var_mean(a, dim=(0, 1)), m, a.amin(dim=(0, 1)), (a * 0.01 + 1).prod(0).prod(0),
            (a - m) * 2)


@pytest.mark.parametrize("shape", [(7, 300, 16), (1, 2048, 16), (40, 64, 32)])
@pytest.mark.parametrize("threads", [1, 2])
def test_one_lane_block_splits_reduced_dims_over_threads(shape, threads):
    """NHWC batch-norm statistics: one block of lanes, so the threads split the first reduced
    dim and fold their partials in thread order: eager's results, NaN included, and the same
    bits on every run."""
    a = torch.randn(*shape)
    a[0, 5, 3] = float("nan")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        c = check(_channel_stats, a, atol=1e-5)
        assert "omp barrier" in c.extra["cpp"]
        first, again = c.run([a]), c.run([a])
        assert all(torch.equal(x.nan_to_num(), y.nan_to_num()) for x, y in zip(first, again))
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("shape", [(2, 3, 10, 9), (3, 1, 4, 17), (2, 4, 6, 8), (2, 2, 5, 40)])
def test_tiny_innermost_dims_unroll_inside_the_next_loop(shape):
    """NCHW -> NHWC of few channels: the channel loop (1-4 iterations) is unrolled inside a
    vector loop over the width instead of being the vector loop itself."""
    def f(x, w):
        return (x.permute(0, 2, 3, 1) * w).contiguous(), x.permute(0, 2, 3, 1).exp().contiguous()
    x = torch.randn(*shape)
    x[0, 0, 1, 2] = float("nan")
    c = check(f, x, torch.randn(shape[1]), atol=1e-5)
    simd_loops = re.findall(r"omp simd *\n *for \(int64_t \w+ = 0; \w+ < (\d+);", c.extra["cpp"])
    assert simd_loops and str(shape[1]) not in simd_loops
