"""Per-lowering checks of the C++ backend against eager: layouts, broadcasting, size-1 and
zero-size dims, NaN/Inf. Each test batches many ops into one graph to share one C++ build."""
import pytest
import torch
import torch.nn.functional as F

from cpp_helpers import assert_same, check, compile_cpp
from shared_programs import scatters
from trainc import rng


def _special(*shape):
    x = torch.randn(*shape)
    flat = x.view(-1)
    flat[::7] = float("nan")
    flat[3::11] = float("inf")
    flat[5::13] = -float("inf")
    return x


def test_pointwise_layouts():
    base = torch.randn(6, 10)

    def f(a, b, c):
        t = a.t()  # transposed
        s = a[1::2, ::3]  # sliced with steps
        e = c.expand(6, 10)  # expanded, broadcast
        return (a + b * 2 - 1, t.exp() * t.sigmoid(), s.tanh() / (s.abs() + 1),
                torch.erf(e) + a, a * c, torch.relu(b) - torch.clamp(a, -0.5, 0.5),
                torch.rsqrt(a.abs() + 1), torch.where(a > b, a, b), a.pow(2) + b.neg(),
                torch.maximum(a, b), torch.minimum(a, b * 0.25), F.gelu(a),
                F.gelu(b, approximate="tanh"),
                torch.log1p(a.abs()), torch.sqrt(b.abs()).sin().cos(), torch.floor(a * 3),
                a.reciprocal(), torch.sign(b))
    check(f, base, torch.randn(6, 10), torch.randn(1, 10), rtol=1e-5, atol=1e-5)


def test_nan_inf_propagation():
    def f(a, b):
        return (a + b, torch.maximum(a, b), torch.minimum(a, b), torch.relu(a),
                torch.clamp(a, -1, 1), a.exp(), a > 0, a == a, torch.isnan(a), torch.isinf(b),
                torch.where(torch.isnan(a), b, a), a.amax(1), a.amin(0), a.sum(1),
                torch.softmax(a, 1), a.argmax(1))
    check(f, _special(5, 13), _special(5, 13), atol=1e-5)


def test_size_one_and_zero_dims():
    def f(a, b, z):
        return a * b, (a + 1).sum(0), b.mean(1, keepdim=True), z * 2, z.sum(1), a.expand(4, 3, 7)
    check(f, torch.randn(1, 7), torch.randn(3, 1), torch.randn(0, 5))


def test_integer_and_bool_math():
    def f(a, b, m):
        return (a // b, a % b, torch.remainder(a, -3), a & b, a | 6, ~a, a ^ b, a * b - 7,
                (a > b) & m, m | ~m, torch.logical_and(m, a > 0), a.to(torch.float32) / 3,
                (a.float() * 0.7).to(torch.int64), m.to(torch.int64).sum(), a.abs(),
                torch.where(m, a, -a), a.sum(0))
    a = torch.randint(-20, 20, (4, 9))
    b = torch.randint(1, 6, (4, 9)) * torch.tensor([1, -1]).repeat(1, 5)[:, :9]
    check(f, a, b, torch.rand(4, 9) > 0.5)


def test_casts_and_low_precision():
    def f(a, h):
        return (a.to(torch.bfloat16), h.float() * 2, (h * h).to(torch.float32), h + 1,
                h.sum(1), torch.softmax(h, -1), a.to(torch.bfloat16).to(torch.float32),
                (a > 0).to(torch.bfloat16))
    a = torch.randn(8, 33) * 100
    c = compile_cpp(f, a, a.to(torch.bfloat16))
    outs = c.run([a, a.to(torch.bfloat16)])
    refs = f(a, a.to(torch.bfloat16))
    for k, (o, r) in enumerate(zip(outs, refs)):
        # fused bf16 math rounds only when stored: within one bf16 ulp of eager per op
        assert_same(o, r, rtol=2e-2, atol=2e-2, what=f"output {k}")
    assert torch.equal(outs[0], refs[0]) and torch.equal(outs[6], refs[6])  # rounding is exact


def test_views_as_index_arithmetic():
    def f(a, b):
        v = a.view(4, 6, 5)
        return (v.permute(2, 0, 1) + 1, a.reshape(120)[3:100:7] * 2,
                v.transpose(0, 1).reshape(6, 20),
                torch.cat([a, b, a[:2]], 0) * 1, torch.cat([a.t(), a.t()], 1) + 0,
                F.pad(a, (2, 1, 0, 3), value=-1.5), a.flip(0, 1) - 1,
                v.select(1, 2) * 3, *(t * 1 for t in a.split([7, 13, 10], 1)),
                a.unsqueeze(1).squeeze(1) + b.amax(), v[:, 1:5:2, ::2] + 0.5,
                F.pad(a, (-2, 1)) * 2)
    check(f, torch.randn(4, 30), torch.randn(3, 30))


@pytest.mark.parametrize("shape,dims", [((6, 40), (1,)), ((5, 7, 9), (0, 2)), ((8, 16), (0,))])
def test_reductions(shape, dims):
    def f(a):
        d = dims[0]
        v, m = torch.var_mean(a, dims, correction=1, keepdim=True)
        mx = a.max(d)
        return (a.sum(dims), a.mean(dims, keepdim=True), a.amax(dims), a.amin(dims),
                a.argmax(d), a.argmin(d, keepdim=True), v, m, torch.var(a, dims, correction=0),
                torch.softmax(a, d), torch.log_softmax(a, d), torch.logsumexp(a, dims),
                mx.values, mx.indices, a.prod(d), (a > 0).any(d), a.std(d))
    a = torch.randn(*shape)
    a.view(-1)[::5] = a.view(-1)[1::5]  # ties for argmax/argmin: the first index wins
    check(f, a, atol=1e-5)


def test_layer_norm_and_softmax_backward():
    def f(x, w, b, g):
        y, mean, rstd = torch.ops.aten.native_layer_norm(x, [16], w, b, 1e-5)
        s = torch.softmax(x, -1)
        return (y, mean, rstd, torch.ops.aten._softmax_backward_data(g, s, -1, torch.float32),
                torch.ops.aten._log_softmax_backward_data(g, torch.log_softmax(x, -1), -1,
                                                          torch.float32))
    check(f, torch.randn(3, 5, 16), torch.randn(16), torch.randn(16), torch.randn(3, 5, 16),
          atol=1e-5)


def test_indirect_indexing():
    def f(w, idx, x, g, src):
        acc = torch.zeros(10, 4).index_put([idx.view(-1)], g.view(-1, 4), accumulate=True)
        return (F.embedding(idx, w), torch.index_select(x, 1, idx[0] % 6),
                torch.gather(x, 1, idx % 6),
                x[idx[0] % 3], acc, torch.zeros(3, 6).scatter_add(1, idx[:, :3] % 6, src),
                torch.zeros(10, 4).index_put([idx.view(-1)], g.view(-1, 4)))
    idx = torch.tensor([[1, 3, 3, 0, 9], [2, 2, 2, 7, 1], [0, 5, 3, 3, 8]])
    w, x = torch.randn(10, 4), torch.randn(3, 6)
    g = torch.randn(3, 5, 4)
    c = compile_cpp(f, w, idx, x, g, torch.randn(3, 3))
    args = [w, idx, x, g, torch.randn(3, 3)]
    outs, refs = c.run(list(args)), f(*args)
    for k, (o, r) in enumerate(zip(outs[:-1], refs[:-1])):
        assert_same(o, r, what=f"output {k}")
    # index_put without accumulate: with duplicate indices any one write is valid
    unique = idx.view(-1).unique()
    assert_same(outs[-1][unique].abs().sum(1) > 0, refs[-1][unique].abs().sum(1) > 0)
    assert not c.fallback_ops


def test_scatter_with_one_index_per_row_and_slice_select_scatter():
    x, s = _special(5, 7), torch.randn(5, 7)
    i = torch.tensor([[2], [0], [4], [4], [1]])
    check(scatters, x, i, s, torch.randn(5, 1))


def test_max_pool_and_backward():
    def f(x, g):
        y, i = torch.ops.aten.max_pool2d_with_indices(x, [2, 2], [2, 2])
        gi = torch.ops.aten.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0],
                                                             [1, 1], False, i)
        return y, i, gi
    x = torch.randn(2, 3, 6, 7)
    x[0, 0, 0, 0] = float("nan")
    check(f, x, torch.randn(2, 3, 3, 3))


def test_philox_bitwise_equal_to_reference():
    seed = torch.tensor(0x1234_5678_9ABC, dtype=torch.int64)

    def f(s):
        u = torch.ops.trainc.philox_uniform(s, 17, [5, 77], torch.float32, torch.device("cpu"))
        return u, torch.ops.trainc.philox_uniform(s, 0, [3], torch.bfloat16, torch.device("cpu"))
    c = compile_cpp(f, seed)
    u, h = c.run([seed])
    assert torch.equal(u, rng.philox_uniform(seed, 17, [5, 77], torch.float32, torch.device("cpu")))
    assert torch.equal(h, rng.philox_uniform(seed, 0, [3], torch.bfloat16, torch.device("cpu")))
    assert 0 <= float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.05


def test_cumsum_int_and_float_along_any_dim():
    def f(m, a):
        return torch.cumsum(m, 1), torch.cumsum(a, 0), torch.cumsum(a, -1, dtype=torch.float64)
    m = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.int32)
    check(f, m, torch.randn(7, 13))


def test_fallback_runs_aten_and_is_listed():
    def f(a):  # too long a dim for the triangular cumsum
        return torch.cumsum(a, 1) * 2 + 1
    a = torch.randn(2, 1100)
    c = compile_cpp(f, a)
    assert_same(c.run([a])[0], f(a))
    assert c.fallback_ops == ("aten.cumsum.default",)


def test_extern_matmuls_take_views():
    def f(a, b, bias):
        return torch.mm(a.t(), b) + 1, torch.addmm(bias, a.t(), b), torch.bmm(
            a.t().unsqueeze(0).expand(2, 5, 4), b.unsqueeze(0).expand(2, 4, 3)).relu()
    c = check(f, torch.randn(4, 5), torch.randn(4, 3), torch.randn(3), atol=1e-5)
    assert "as_strided" in c.source and c.fallback_ops == ()  # views go to mm without a copy


def _ulps(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """|x - ref| in units of float32 spacing at ref."""
    r = ref.float()
    spacing = (torch.nextafter(r.abs(), torch.tensor(float("inf"))) - r.abs()).double()
    return (x.double() - ref).abs() / spacing


def test_vectorized_float32_math_is_within_a_few_ulp():
    """tc_exp/tc_tanh/tc_erf (the prelude's vectorizable float32 math) against float64:
    tanh lost 2-3 bits to cancellation just above its polynomial range (5.5 ulp at 0.2-0.55)."""
    from cpp_helpers import compile_cpp
    x = torch.cat([torch.linspace(-10, 10, 200001), torch.linspace(-0.6, 0.6, 100001)])
    c = compile_cpp(lambda t: (torch.exp(t), torch.tanh(t), torch.erf(t)), x)
    outs = c.run([x])
    for name, o, ref in zip(("exp", "tanh", "erf"), outs,
                            (torch.exp(x.double()), torch.tanh(x.double()), torch.erf(x.double()))):
        worst = float(_ulps(o, ref)[torch.isfinite(ref.float())].max())
        assert worst <= (3.0 if name == "erf" else 1.6), f"{name}: {worst:.2f} ulp"
