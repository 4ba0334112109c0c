"""Eager semantics through trainc.compile: mutation, aliasing, requires_grad, outputs, recompiles."""
import copy
import pytest
import torch
import torch.nn as nn

import trainc
from policy import assert_policy


BACKEND = "aten"


@pytest.fixture(autouse=True, params=["aten", "cpp"])
def backend(request):
    """Every test here runs on the reference backend and on generated C++."""
    global BACKEND
    BACKEND = request.param
    yield request.param


def _compile(fn):
    torch._dynamo.reset()
    return trainc.compile(fn, backend=BACKEND)


def _grads(fn, *inputs):
    """(outputs, grads of inputs requiring grad) of fn, summing every float output as the loss."""
    xs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    out = fn(*xs)
    outs = out if isinstance(out, (tuple, list)) else [out]
    loss = sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs)
               if o.is_floating_point() and o.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()
    return outs, [x.grad for x in xs if x.requires_grad], xs


def _check(fn, *inputs):
    """Compiled fn matches eager (float64 reference) in outputs and input grads."""
    ref_inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    ref_inputs = [r.requires_grad_(x.requires_grad) if r.is_floating_point() else r
                  for r, x in zip(ref_inputs, inputs)]
    eo, eg, ex = _grads(fn, *inputs)
    co, cg, cx = _grads(_compile(fn), *inputs)
    ro, rg, rx = _grads(fn, *ref_inputs)
    assert len(co) == len(eo)
    for i, (c, e, r) in enumerate(zip(co, eo, ro)):
        assert c.requires_grad == e.requires_grad, f"output {i} requires_grad"
        assert_policy(f"output {i}", c, e, r)
    for i, (c, e, r) in enumerate(zip(cg, eg, rg)):
        assert_policy(f"grad {i}", c, e, r)
    for i, (c, e, r) in enumerate(zip(cx, ex, rx)):  # inputs mutated in place
        assert_policy(f"input {i} after call", c.detach(), e.detach(), r.detach())
    return co, cx


def test_inplace_on_user_input():
    def f(x, w):
        x.mul_(2)
        return (x * w).sin()
    x, w = torch.randn(4, 3), torch.randn(3, requires_grad=True)
    _, (cx, _) = _check(f, x, w)
    v = x.clone()
    before = v._version
    _compile(f)(v, w)
    assert v._version > before, "the input's version counter must be bumped"
    assert torch.allclose(v, x * 2)


def test_inplace_on_intermediates():
    def f(x):
        y = x * 2
        y.add_(1)
        z = y[1:]
        z.mul_(3)
        w = (x - 0.5).relu_()
        return y.exp() + w
    _check(f, torch.randn(5, 4, requires_grad=True))


def test_output_is_input_or_view_of_input():
    def f(x, y):
        return x, x.view(-1)[1:5], x.t(), y * 2
    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(3)
    (ox, ov, ot, oy), _ = _check(f, x, y)
    xs = torch.randn(3, 4)
    cx, cv, ct, _ = _compile(f)(xs, y)
    assert cv.data_ptr() == xs.data_ptr() + 4 and ct.stride() == (1, 4)
    xs[0, 2] = 100.0
    assert cv[1].item() == 100.0, "a view output must see later writes to the input"


def test_outputs_aliasing_each_other():
    def f(x):
        y = x * 2
        return y.view(-1), y[0], y.t()
    outs, _ = _check(f, torch.randn(3, 4, requires_grad=True))
    a, b, c = _compile(f)(torch.randn(3, 4))
    a[1] = 42.0
    assert b[1].item() == 42.0 and c[1, 0].item() == 42.0


def test_equal_outputs_stay_separate_tensors():
    """Two equal expressions (merged by CSE) are two tensors in eager: each gets its own
    tangent (summing them first turns inf * t1 + inf * t2 into NaN differently) and writing
    to one leaves the other alone."""
    def f(x):
        return x @ x.t(), x @ x.t()
    x = torch.tensor([[float("-inf"), 1.0], [2.0, 3.0]], requires_grad=True)
    t1, t2 = torch.tensor([[1.0, -1.0], [2.0, 0.5]]), torch.tensor([[-1.0, 1.0], [1.0, 1.0]])
    a, b = _compile(f)(x)
    assert a is not b and a.data_ptr() != b.data_ptr()
    (g,) = torch.autograd.grad((a, b), (x,), (t1, t2))
    e1, e2 = f(x)
    (ge,) = torch.autograd.grad((e1, e2), (x,), (t1, t2))
    assert torch.equal(torch.isnan(g), torch.isnan(ge)), (g, ge)
    a2, b2 = _compile(f)(torch.ones(2, 2))
    a2.add_(1.0)
    assert torch.equal(b2, torch.full((2, 2), 2.0))


def test_mixed_requires_grad_and_integer_inputs():
    def f(x, w, idx, k):
        return (x[idx] * w).sum(0) + k.float().mean(), idx * 2
    x, w = torch.randn(5, 3), torch.randn(3, requires_grad=True)
    idx, k = torch.tensor([0, 2, 4, 2]), torch.arange(6)
    (_, oi), _ = _check(f, x, w, idx, k)
    assert oi.dtype == torch.int64 and not oi.requires_grad


def test_grad_is_none_for_unused_and_non_grad_inputs():
    def f(a, b, c):
        return a * 3 + c
    a, b, c = (torch.randn(3, requires_grad=True) for _ in range(3))
    c.requires_grad_(False)
    _compile(f)(a, b, c).sum().backward()
    assert a.grad is not None and b.grad is None and c.grad is None


class TupleDictModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 2)

    def forward(self, x):
        h = self.a(x)
        return {"h": h, "pair": (self.b(x).tanh(), h.sum(-1))}


def test_tuple_and_dict_outputs():
    m = TupleDictModel()
    x = torch.randn(5, 4)
    out_e = m(x)
    out_c = _compile(m)(x)
    assert set(out_c) == {"h", "pair"} and isinstance(out_c["pair"], tuple)
    loss_e = out_e["h"].sum() + out_e["pair"][0].pow(2).sum() + out_e["pair"][1].sum()
    ge = torch.autograd.grad(loss_e, list(m.parameters()))
    loss_c = out_c["h"].sum() + out_c["pair"][0].pow(2).sum() + out_c["pair"][1].sum()
    gc = torch.autograd.grad(loss_c, list(m.parameters()))
    for e, c in zip(ge, gc):
        torch.testing.assert_close(c, e)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.out = nn.Linear(6, 10, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, idx):
        return self.out(self.emb(idx).tanh())


def test_weight_tying():
    m = Tied()
    idx = torch.randint(0, 10, (4, 3))
    m(idx).square().sum().backward()
    ge = m.emb.weight.grad.clone()
    m.zero_grad()
    _compile(m)(idx).square().sum().backward()
    torch.testing.assert_close(m.emb.weight.grad, ge)


def test_noncontiguous_and_expanded_inputs():
    def f(x, y):
        return (x * y).logsumexp(-1), x.sum(0)
    x = torch.randn(6, 4).t().requires_grad_(True)
    y = torch.randn(6).expand(4, 6)
    _check(f, x, y)
    _check(f, torch.randn(4, 12)[:, ::2].detach().requires_grad_(True), y)


def test_shape_change_recompiles_and_stays_correct():
    m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    c = _compile(m)
    for batch in (3, 5, 3, 7):
        x = torch.randn(batch, 4)
        torch.testing.assert_close(c(x), m(x))
    x64 = torch.randn(2, 4, dtype=torch.float64)
    m64 = nn.Linear(4, 2).double()
    assert _compile(m64)(x64).dtype == torch.float64


def test_eval_mode_and_no_grad():
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    c = _compile(m)
    x = torch.randn(8, 4)
    m.eval()
    stats = m[1].running_mean.clone(), m[1].num_batches_tracked.clone()
    torch.testing.assert_close(c(x), m(x))
    assert torch.equal(m[1].running_mean, stats[0]) and m[1].num_batches_tracked == stats[1]
    m.train()
    with torch.no_grad():
        y = c(x)
    assert not y.requires_grad and m[1].num_batches_tracked.item() == 1


def test_batchnorm_buffers_update_like_eager():
    import copy
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    e = copy.deepcopy(m)
    c = _compile(m)
    for _ in range(2):
        x = torch.randn(2, 3, 6, 6)
        c(x).sum().backward()
        e(x).sum().backward()
    for (n, a), (_, b) in zip(m.named_buffers(), e.named_buffers()):
        torch.testing.assert_close(a, b, msg=n)


def test_backward_makes_no_zeros_for_outputs_without_gradients():
    """Mutated buffers are outputs of the autograd Function without gradients: backward gets
    None for them (no zeros tensor per buffer per step); an unused output's tangent is zeros."""
    m = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
    c = _compile(m)
    x = torch.randn(16, 8)
    c(x).sum().backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        c(x).sum().backward()
    assert not [e.key for e in p.key_averages() if e.key in ("aten::zeros", "aten::zeros_like")]

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            return y * 2, y.exp()
    t, ref = Two(), Two()
    ref.load_state_dict(t.state_dict())
    _, b = _compile(t)(torch.ones(2, 4))
    b.sum().backward()
    ref(torch.ones(2, 4))[1].sum().backward()
    for p_, q in zip(t.parameters(), ref.parameters()):
        torch.testing.assert_close(p_.grad, q.grad)


def test_expanded_tangents_are_read_in_place():
    """out.sum()'s gradient is expanded (stride 0): the backward compiled for that layout reads
    it as it is (no dense copy) and gives eager's gradients; so does a partly expanded one."""
    import copy
    m = nn.Sequential(nn.LayerNorm(16), nn.GELU())
    e = copy.deepcopy(m)
    c = _compile(m)
    x = torch.randn(8, 16)
    r = copy.deepcopy(m).double()
    for loss in (lambda y: y.sum(), lambda y: y.sum(0).pow(2).sum(), lambda y: (y * y).sum()):
        xc, xe, xr = (x.clone().to(dt).requires_grad_() for dt in (x.dtype, x.dtype, torch.double))
        for fn, xi in ((c, xc), (e, xe), (r, xr)):
            loss(fn(xi)).backward()
        assert_policy("x.grad", xc.grad, xe.grad, xr.grad)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        c(x).sum().backward()
    assert not [e.key for e in p.key_averages() if e.key == "aten::clone"]  # contiguous()


def test_expanded_tangent_backward_compiles_in_background(monkeypatch):
    """With background compiles (triton on CUDA by default; forced here) the first call with an
    expanded tangent runs the traced backward on a dense copy while the variant compiles in a
    thread; once it is ready, calls read the tangent in place. Gradients match eager throughout.
    background_compile=False compiles it at that call (as cpp/aten by default)."""
    import copy
    import threading
    from trainc import pipeline, runtime
    monkeypatch.setattr(pipeline, "compiles_natively_on_cuda", lambda name, device: True)
    release = threading.Event()
    compile_for_tangents = pipeline._compile_for_tangents

    def slow(*args):
        release.wait(30)
        return compile_for_tangents(*args)
    monkeypatch.setattr(pipeline, "_compile_for_tangents", slow)
    m = nn.Sequential(nn.LayerNorm(16), nn.GELU())
    e, r = copy.deepcopy(m), copy.deepcopy(m).double()
    c = _compile(m)
    x = torch.randn(8, 16)

    def check():
        xc, xe, xr = (x.clone().to(dt).requires_grad_() for dt in (x.dtype, x.dtype, torch.double))
        for fn, xi in ((c, xc), (e, xe), (r, xr)):
            fn(xi).sum().backward()
        assert_policy("x.grad", xc.grad, xe.grad, xr.grad)

    def copies():
        check()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
            c(x).sum().backward()
        return [k.key for k in p.key_averages() if k.key == "aten::clone"]
    assert copies() and copies()  # pending: the dense copy, twice
    release.set()
    runtime.wait_for_background_compiles()
    assert not copies()  # the variant now
    assert not runtime._pending


def test_failed_background_compile_warns_and_keeps_the_dense_copy(monkeypatch):
    from trainc import pipeline, runtime
    monkeypatch.setattr(pipeline, "compiles_natively_on_cuda", lambda name, device: True)

    def broken(*args):
        raise RuntimeError("no kernel today")
    monkeypatch.setattr(pipeline, "_compile_for_tangents", broken)
    c = _compile(nn.Sequential(nn.LayerNorm(16), nn.GELU()))
    x = torch.randn(8, 16, requires_grad=True)
    c(x).sum().backward()
    runtime.wait_for_background_compiles()
    g = x.grad.clone()
    x.grad = None
    with pytest.warns(UserWarning, match="no kernel today"):
        c(x).sum().backward()
    torch.testing.assert_close(x.grad, g, rtol=0, atol=0)


def test_double_backward_raises_clear_error():
    c = _compile(lambda x: (x ** 3).sum())
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(trainc.UnsupportedError, match="double backward"):
        torch.autograd.grad(c(x), x, create_graph=True)
    (g,) = torch.autograd.grad(c(x), x)  # a plain backward still works
    torch.testing.assert_close(g, 3 * x.detach() ** 2)


def test_hook_on_intermediate_is_honoured():
    seen = []

    def f(x):
        y = x * 2
        y.register_hook(lambda g: seen.append(g.clone()) or g * 10)
        return y.sin().sum()

    x = torch.randn(4, requires_grad=True)
    f(x).backward()
    expected = x.grad.clone()
    x.grad = None
    _compile(f)(x).backward()
    assert len(seen) == 2
    torch.testing.assert_close(x.grad, expected)


def test_graph_break_compiles_each_graph_and_stays_correct():
    def f(x):
        y = (x * 2).sin()
        if y.sum() > 0:  # data-dependent branch: Dynamo breaks the graph here
            y = y * 3
        return y.cos().sum()

    x = torch.randn(8, requires_grad=True)
    f(x).backward()
    expected = x.grad.clone()
    x.grad = None
    torch._dynamo.reset()
    with trainc.records.recording() as recs:
        trainc.compile(f, backend="aten")(x).backward()
    assert len(recs) >= 2, "each side of the break is its own graph"
    torch.testing.assert_close(x.grad, expected)


def test_expanded_output_keeps_eager_strides():
    """Regression (fuzz): an expand of an intermediate came back through an overlapping copy."""
    def f(x):
        return (x + 1.5).expand(2, -1, -1)
    out, _ = _check(f, torch.randn(3, 4, requires_grad=True))
    assert out[0].stride() == (0, 4, 1)


def test_reductions_over_dim_of_0d_tensor():
    """Regression (fuzz): dim 0/-1 of a 0-d tensor crashed the C++ reduction lowering."""
    _check(lambda x: (x.sum(0, keepdim=True), x.amax(-1), x.mean(0)),
           torch.randn((), requires_grad=True))


def test_complex_intermediate_and_output():
    """Regression (fuzz): complex values fall back to ATen in codegen, and complex outputs
    keep their gradients."""
    _check(lambda x: torch.view_as_complex(x * 2).abs(), torch.randn(3, 2, requires_grad=True))
    re, im = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    z = _compile(lambda a, b: torch.complex(a, b) * 2)(re, im)
    assert z.requires_grad
    z.abs().sum().backward()
    expected = 2 * re.detach() / torch.complex(re, im).abs().detach()
    torch.testing.assert_close(re.grad, expected)


def test_view_output_of_an_expanded_input():
    """Regression (nightly fuzz): a view output of an input whose elements overlap (expanded)
    was rebuilt with as_strided, whose backward summed the aliased positions: wrong grad."""
    x = torch.randn(1, 1).expand(1, 2).requires_grad_()
    _check(lambda a: a.transpose(0, 1), x)
    _check(lambda a: (a.t(), a * 2), torch.randn(3, 1).expand(3, 4).requires_grad_())


class _LossAndLogits(nn.Module):
    """A model returning its logits beside its loss, as Hugging Face models do."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 64)

    def forward(self, x):
        logits = self.head(torch.tanh(x))
        return logits.float().logsumexp(-1).mean(), logits


@pytest.mark.parametrize("threshold", [0, 1 << 40])
def test_unused_output_tangent_is_expanded_zero_not_dense(monkeypatch, threshold):
    from trainc import runtime
    monkeypatch.setattr(runtime, "ZERO_TANGENT_EXPAND_BYTES", threshold)
    zeros = []
    real = runtime._tangents

    def spy(grads, meta, expandable):
        out = real(grads, meta, expandable)
        zeros.extend(t for g, t in zip(grads, out[0]) if g is None)
        return out
    monkeypatch.setattr(runtime, "_tangents", spy)
    m = _LossAndLogits()
    e, r = copy.deepcopy(m), copy.deepcopy(m).double()
    c = _compile(m)
    x = torch.randn(8, 16)
    for _ in range(2):  # the second call runs the compiled expanded variant
        xc, xe, xr = (x.clone().to(dt).requires_grad_() for dt in (x.dtype, x.dtype, torch.double))
        for fn, xi in ((c, xc), (e, xe), (r, xr)):
            fn(xi)[0].backward()
        assert_policy("x.grad", xc.grad, xe.grad, xr.grad)
        for p, q, s in zip(m.parameters(), e.parameters(), r.parameters()):
            assert_policy("param grad", p.grad, q.grad, s.grad)
            p.grad = q.grad = s.grad = None
    assert len(zeros) == 2
    strides = {tuple(z.stride()) for z in zeros}
    assert strides == ({(0, 0)} if threshold == 0 else {(64, 1)})
