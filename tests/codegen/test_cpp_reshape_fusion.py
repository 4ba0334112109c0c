"""Fusion across reshapes (equal-size nodes of different shapes), equal-part cat, commutative
spelling: kernel counts and generated code for the patterns gpt's graphs contain."""
import math

import pytest
import torch
import torch.nn.functional as F

from cpp_helpers import check
from trainc.codegen import reshape


def test_layer_norm_whose_output_is_flattened_for_a_matmul_is_one_kernel():
    # stats reduce over [4, 8] rows; the normalized value is realized as [32, 16] for the mm
    def f(x, w, b, m):
        return F.layer_norm(x, (16,), w, b).view(32, 16) @ m
    c = check(f, torch.randn(4, 8, 16), torch.randn(16), torch.randn(16), torch.randn(16, 5),
              atol=1e-5)
    assert len(c.kernels) == 1, [k.nodes for k in c.kernels]


def test_softmax_backward_with_heads_merged_for_bmm_is_one_kernel():
    # the row sums have outer [2, 3, 8]; the pointwise result is realized as [6, 8, 8]
    def f(y, g, v):
        d = g * y - y * (g * y).sum(-1, keepdim=True)
        return d.view(6, 8, 8) @ v
    y = torch.softmax(torch.randn(2, 3, 8, 8), -1)
    c = check(f, y, torch.randn(2, 3, 8, 8), torch.randn(6, 8, 4), atol=1e-5)
    assert len(c.kernels) == 1, [k.nodes for k in c.kernels]


def test_sibling_pointwise_of_another_shape_joins_and_its_buffer_keeps_its_layout():
    # both outputs read x: the [8, 12] result joins the [2, 4, 12] kernel, reshaped
    def f(x, m):
        return (x * 2).exp(), (x.view(8, 12) + 1).tanh() @ m
    c = check(f, torch.randn(2, 4, 12), torch.randn(12, 3), atol=1e-5)
    assert len(c.kernels) == 1, [k.nodes for k in c.kernels]
    outs = c.run([torch.randn(2, 4, 12), torch.randn(12, 3)])
    assert outs[0].shape == (2, 4, 12) and outs[0].is_contiguous()


def test_transposed_reshapes_do_not_fuse():
    # [16, 8] vs [8, 16] cut the data differently: no common loop, no fusion
    assert not reshape.refines((4, 16, 8), (4, 8, 16))
    assert reshape.refines((4, 64, 128), (256, 128)) and reshape.refines((256,), (4, 64))

    def f(x):
        return x * 2, x.transpose(2, 3) * 3, x.transpose(2, 3).reshape(2, 3, 128) * 4
    c = check(f, torch.randn(2, 3, 8, 16))
    # the transposed product is an output laid out as eager lays it out (x's memory order), so
    # it is computed in that order, in x * 2's loop; the reshaped copy is written from the same
    # loop at transposed positions
    assert len(c.kernels) == 1, [k.nodes for k in c.kernels]


def test_cat_of_equal_parts_reads_each_part_in_bounds_and_splits_the_dim():
    def f(a, b, c, m):
        y = torch.cat([a.transpose(1, 2), b, c], -1)  # [2, 8, 3 * 16]
        return y.view(16, 48) @ m
    a, b, c = torch.randn(2, 16, 8), torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    a[0, 1, 2] = float("nan")
    c = check(f, a, b, c, torch.randn(48, 5), atol=1e-5)
    assert len(c.kernels) == 1
    src = _kernels(c)
    assert "std::min" not in src and "std::max" not in src  # no clamped indices
    assert "< 3; ++" in src  # the cat dim runs as (part, position)


@pytest.mark.parametrize("sizes", [(3, 5), (4, 4, 1), (2, 0, 3)])
def test_cat_of_unequal_and_empty_parts(sizes):
    parts = [torch.randn(3, s) for s in sizes]
    check(lambda *p: torch.cat(p, 1) * 2, *parts)


def test_commutative_spellings_share_one_tanh():
    # gelu's forward recomputed in a backward spells x*x*x and the constants the other way
    k = math.sqrt(2 / math.pi)

    def f(x):
        a = torch.tanh(k * (x + 0.044715 * (x * (x * x))))
        b = torch.tanh((x + ((x * x) * x) * 0.044715) * k)
        return a + 1, b * b
    c = check(f, torch.randn(8, 32), atol=1e-6)
    assert _kernels(c).count("tc_tanh(") == 1


def _kernels(c) -> str:
    """The generated kernels without the prelude."""
    src = c.extra["cpp"]
    return src[src.index('extern "C"'):]


def test_zero_size_values_are_never_reshaped():
    # fuzz finding: a zero-size cat split its dim by a zero-size part (modulo by zero)
    def f(x):
        return torch.tanh(x.transpose(0, 2)), torch.rsqrt(torch.cat([x, x], 0) ** 2 + 1)
    check(f, torch.randn(4, 4, 0, 2).transpose(-2, -1))


def test_gpt_kernel_count():
    # 65 kernels before fusion across reshapes: LayerNorm rows vs [B*T, C] results, the gelu
    # backward's tanh in [B, T, 4C], softmax backward rows vs merged heads, the qkv-grad cat
    import models
    import trainc
    model, inputs, _ = models.build("gpt")
    # 46 with every output contiguous; outputs computed in their traced dense layout (saved
    # transposed values: no layout copies in the backward) fuse less: 50. Same step time on
    # the 2-core box at 1 thread (trainc/Inductor 1.07 vs 1.09, session 3).
    assert len(trainc.explain(model, *inputs, backend="cpp",
                              partition_objective="bytes").kernels) <= 50
