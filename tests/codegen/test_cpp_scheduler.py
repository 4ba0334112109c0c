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
    # inputs above scheduler.SMALL_NODE: tiny ones would all share one kernel anyway
    c = check(f, torch.randn(256, 400), torch.randn(256, 400), torch.randn(400), atol=1e-5)
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


def test_cheap_multi_use_value_is_recomputed_not_stored():
    def f(x, i, w):
        # cross_entropy's backward: a one-hot scaled per row, read by a row sum and a pointwise
        onehot = torch.zeros_like(x).scatter_(1, i, -1.0) * w
        return onehot - torch.softmax(x, 1) * onehot.sum(1, keepdim=True)
    c = check(f, torch.randn(16, 300), torch.randint(0, 300, (16, 1)), torch.rand(16, 1),
              atol=1e-5)
    written = sum(k.bytes_written for k in c.kernels)
    assert written < 2 * 16 * 300 * 4  # the output alone: the one-hot is never stored


def test_late_node_does_not_join_an_early_kernel():
    def f(x, w):
        a = x.exp()
        h = a
        for _ in range(20):  # twenty program steps (externs) between the two uses of x
            h = h @ w
        # joining `a`'s kernel would keep sin * 2 alive all along, for the last mm
        return h, (x.sin() * 2) @ w
    c = check(f, torch.randn(128, 256), torch.randn(256, 256) / 16, rtol=1e-4, atol=1e-4)
    assert len(c.kernels) == 2  # exp (realized for the first mm) and sin * 2, apart


def test_late_values_only_outputs_read_join_an_early_kernel():
    """A forward's saved values come at its end; outputs live to the end anyway, and so does a
    value only outputs read, so they join the kernel that reads the same input (one pass)."""
    def f(x, w):
        a = x.exp()
        h = a
        for _ in range(20):
            h = h @ w
        t = (x * 0.7).tanh().exp().sin()  # expensive, read by two outputs: materialized
        return h, t + 1, t * x
    c = check(f, torch.randn(128, 256), torch.randn(256, 256) / 16, rtol=1e-4, atol=1e-4)
    assert len(c.kernels) == 1
    assert c.kernels[0].bytes_read == 128 * 256 * 4  # x once


def test_upcast_of_a_stored_16_bit_value_is_stored_narrow():
    """A float32 copy of a bfloat16 value that must be stored (expensive, two users: a bf16
    norm backward's upcast gradient) is stored as the bfloat16 value and widened at each load:
    the same numbers, half the bytes written."""
    def f(x, w):
        g = ((x * 3).exp().sin().cos() * w + x.sqrt()).to(torch.float32)
        return g.sum(0), g * g.mean(0)
    x, w = torch.rand(64, 48).bfloat16(), torch.rand(48).bfloat16()
    c = check(f, x, w, atol=1e-5)
    written = sum(k.bytes_written for k in c.kernels)
    # the stored g (2 bytes per element), the product output (4) and the sums
    assert written < 64 * 48 * (2 + 4) + 4 * 48 * 8, written


def test_large_node_does_not_join_a_kernel_for_a_shared_scalar():
    """A weight update sharing only the learning rate with a bias update (fused into the bias
    gradient's column reduction) gets its own kernel: joining saves no traffic and would run
    the 1M-element update in the reduction's few programs. A small update still joins."""
    def f(dy, b, w, gw, lr, small, gsmall):
        b_new = b - lr * dy.sum(0)  # column reduction + epilogue reading lr
        w_new = w - lr * gw  # large: shares only lr with the reduction kernel
        s_new = small - lr * gsmall  # small: joins to save a launch
        return b_new, w_new, s_new
    n = 1 << 20
    c = check(f, torch.randn(64, 256), torch.randn(256), torch.randn(n), torch.randn(n),
              torch.tensor(0.1), torch.randn(256), torch.randn(256), atol=1e-5)
    big = [k for k in c.kernels if k.bytes_written >= n * 4]
    assert len(big) == 1 and len(big[0].nodes) == 1, [k.nodes for k in c.kernels]
    assert len(c.kernels) == 2, [k.nodes for k in c.kernels]


def test_node_much_larger_than_a_reduction_does_not_join_it_for_a_shared_scalar():
    """A conv weight's update (128 x 1152) sharing only the learning rate with a 128-channel
    statistics kernel runs on its own: inside, it would run in that kernel's inner loops."""
    def f(x, b, w, gw, lr):
        return b - lr * x.sum(0), w - lr * gw
    c = check(f, torch.randn(64, 128), torch.randn(128), torch.randn(128, 1152),
              torch.randn(128, 1152), torch.tensor(0.1), atol=1e-5)
    assert len(c.kernels) == 2, [k.nodes for k in c.kernels]


def test_small_independent_nodes_share_one_kernel():
    """Per-layer counters (BatchNorm's num_batches_tracked += 1) need no launch each."""
    def f(a, b, c, x):
        return a + 1, b + 1, c + 1, x.relu()
    n = [torch.tensor(3), torch.tensor(5), torch.tensor(7)]
    c = check(f, *n, torch.randn(64))
    assert sorted(len(k.nodes) for k in c.kernels) == [1, 3], [k.nodes for k in c.kernels]


def test_small_node_never_joins_a_scatter_kernel():
    """A scatter kernel runs only its own node: a small node after it gets a kernel of its own
    (joined, its result was never written: the gpt pos-embedding gradient came back NaN)."""
    def f(idx, g, w):
        acc = torch.zeros(16, 8).index_put((idx,), g, accumulate=True)
        return acc, w * 2
    idx = torch.tensor([0, 3, 3, 15, 7])
    c = check(f, idx, torch.randn(5, 8), torch.randn(16, 8))
    assert len(c.kernels) == 2


def test_kernel_reading_only_inputs_runs_just_before_its_first_user(monkeypatch):
    """A value of inputs only (here a column sum of v, first in the program) is computed right
    before the kernel that reads it, after the matmul: the host reaches the first large
    launches sooner and the value lives shorter."""
    # ATen's mm, as eager's: sigmoid far out in its tail turns oneDNN's other summation order
    # (float32 rounding of the K=512 product) into 1e-5 relative differences from eager's
    monkeypatch.setenv("TRAINC_CPP_GEMM", "aten")

    def f(x, w, v):
        b = v.exp().sum(0)
        return (x.relu() @ w).sigmoid() * b
    c = check(f, torch.randn(256, 512), torch.randn(512, 256), torch.randn(512, 256), atol=1e-5)
    names = [k.nodes for k in c.kernels]  # relu's kernel is named for the mm it feeds
    assert names == [("mm",), ("sum_1",), ("output",)], names
