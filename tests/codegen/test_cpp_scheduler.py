"""Fusion decisions: kernel counts for known patterns and the bytes each kernel moves."""
import torch
import torch.nn.functional as F

from cpp_helpers import check


def test_layer_norm_forward_is_one_kernel():
    c = check(lambda x, w, b: F.layer_norm(x, (64,), w, b), torch.randn(32, 64), torch.randn(64),
              torch.randn(64), atol=1e-5)
    assert len(c.kernels) == 1
    k = c.kernels[0]
    assert k.bytes_read == (32 * 64 + 64 + 64) * 4  # x, weight, bias once: stats stay local
    assert k.bytes_written == 32 * 64 * 4


def test_pointwise_chain_is_one_kernel():
    c = check(lambda x, y: ((x * 2 + y).sigmoid() * x - y.exp()).tanh() + 1,
              torch.randn(16, 33), torch.randn(16, 33))
    assert len(c.kernels) == 1
    assert c.kernels[0].bytes_read == 2 * 16 * 33 * 4 and c.kernels[0].bytes_written == 16 * 33 * 4


def test_softmax_is_one_kernel_and_sibling_reductions_fuse():
    def f(x, g, w):
        y = torch.softmax(x, -1)
        # the two row reductions of a norm backward read the same inputs: one kernel
        return y, (g * w).sum(-1), (g * w * x).sum(-1)
    c = check(f, torch.randn(8, 40), torch.randn(8, 40), torch.randn(40), atol=1e-5)
    assert len(c.kernels) == 2
    assert sorted(len(k.nodes) for k in c.kernels) == [2, 3]
    sums = [k for k in c.kernels if "sum_1" in k.nodes][0]
    assert "sum_2" in sums.nodes


def test_matmul_splits_kernels_and_is_not_a_fallback():
    c = check(lambda a, b: (a.relu() @ b).sigmoid(), torch.randn(8, 16), torch.randn(16, 4))
    assert len(c.kernels) == 2 and c.fallback_ops == ()


def test_multi_use_value_is_materialized_once():
    def f(x):
        h = (x * 3).exp().sin().cos() + x.sqrt()  # expensive, used by two reductions
        return h.sum(0), h.amax(1)
    c = check(f, torch.rand(64, 48), atol=1e-5)
    names = [k.nodes for k in c.kernels]
    assert sum(len(n) for n in names) >= 2
    assert len(c.kernels) <= 2
