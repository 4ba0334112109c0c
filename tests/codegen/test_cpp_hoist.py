"""C++ loop-invariant values: expensive values that depend only on the vectorized index (a
channels-last batch norm's per-channel scale) are computed once per kernel into an array, with
eager's results (NaN, odd sizes, both layouts of lanes included)."""
import pytest
import torch

from cpp_helpers import check


def _channel_norm(x, mean, var, w):
    # NHWC-like: the channel is the innermost, vectorized dim; mean/var/w vary only along it
    y = (x - mean / 8) * torch.rsqrt(var / 8 + 1e-5) * w
    return y.relu(), (y * x).sum(dim=(0, 1))


@pytest.mark.parametrize("shape", [(4, 6, 16), (3, 5, 7), (2, 33, 64)])
def test_per_channel_values_are_hoisted(shape):
    c = shape[-1]
    x, mean, var, w = torch.randn(*shape), torch.randn(c), torch.rand(c), torch.randn(c)
    var[0] = -1.0  # rsqrt of a negative: NaN in every element of that channel
    x[0, 1, 2 % c] = float("nan")
    cg = check(_channel_norm, x, mean, var, w, atol=1e-5)
    src = cg.extra["cpp"]
    body = src[src.index('extern "C"'):]
    assert "hv0[" in body
    assert body.count("std::sqrt(") == len(cg.kernels)  # once per kernel, outside the loops


def test_values_that_vary_with_other_indices_stay_in_the_loop():
    def f(x, v):  # v varies along the rows: the division is not per column
        return x / torch.sqrt(v[:, None] + x.abs())
    x, v = torch.randn(9, 40), torch.rand(9)
    cg = check(f, x, v, atol=1e-5)
    assert "hv0[" not in cg.extra["cpp"]


def test_values_the_kernel_writes_are_not_hoisted():
    def f(x):  # the column sum is this kernel's reduction: its division waits for the loop
        return x.mean(0), x
    x = torch.randn(64, 24)
    x[3, 5] = float("nan")
    cg = check(f, x, atol=1e-5)
    kernels = cg.extra["cpp"].split('extern "C"')[1:]
    lanes = [k for k in kernels if "lane0" in k]
    assert lanes and all("hv0[" not in k for k in lanes)
