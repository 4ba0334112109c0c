"""Scalar graph inputs (Python floats/ints Dynamo passes as SymFloat/SymInt or 0-d tensors)
on every backend: values read at run time, matching eager under the float64 policy."""
import math

import pytest
import torch
import torch.nn as nn

import trainc
from policy import assert_policy
from trainc import records

VALUES = [(0.5, 2), (1.5, 3), (-2.25, 5), (3.0, 7)]


@pytest.fixture(params=["aten", "cpp", "triton"])
def backend(request):
    if request.param == "triton":
        pytest.importorskip("triton")
        if not torch.cuda.is_available():  # tests/conftest.py sets the interpreter then
            import os
            assert os.environ.get("TRITON_INTERPRET") == "1"
    torch._dynamo.reset()
    return request.param


def _dynamo(fn, backend):
    return torch.compile(fn, backend="trainc", options={"backend": backend})


def _run(fn, x, *scalars):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x, *scalars)
    (g,) = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), x)
    return out.detach(), g


def _check(compiled, fn, x, *scalars):
    co, cg = _run(compiled, x, *scalars)
    eo, eg = _run(fn, x, *scalars)
    ro, rg = _run(fn, x.double(), *scalars)
    assert_policy(f"output at {scalars}", co, eo, ro)
    assert_policy(f"grad at {scalars}", cg, eg, rg)


def _pointwise(x, a, n):
    y = (x * a).sin() + a * 2 - a / 3 + torch.where(x > a, x, a) + x.clamp(min=-a)
    y = y + math.sqrt(abs(a) + 1) * x + torch.full((4, 8), a) * n + x / n + x * (n // 2)
    return y + (a > 0) * x + a / (x.abs() + 1) + x.masked_fill(x > 0.5, a)


def test_scalar_args_read_at_run_time(backend):
    """Dynamo passes the scalars as inputs from the second value on; later values reach the
    same compiled code (no compile per value) and give eager's answer."""
    x = torch.randn(4, 8)
    c = _dynamo(_pointwise, backend)
    with records.recording() as recs:
        for a, n in VALUES:
            _check(c, _pointwise, x, a, n)
    assert len(recs) == 2  # the first call's specialized graph, then the one taking scalars


def test_scalar_arg_baked_in_where_needed(backend):
    """A scalar the traced graph branches on (pow's exponent, add's alpha) is baked in: each
    new value compiles again, never a stale constant."""
    def f(x, a, n):
        return (x.abs() + 1) ** a + torch.add(x, x, alpha=n)
    x = torch.randn(4, 8)
    c = _dynamo(f, backend)
    with records.recording() as recs:
        for a, n in VALUES + VALUES[:2]:
            _check(c, f, x, a, n)
    # one per value, the first value in each of Dynamo's two graphs (specialized, then not)
    assert len(recs) == len(VALUES) + 1


def test_trainc_compile_scalar_values(backend):
    x = torch.randn(4, 8)
    c = trainc.compile(_pointwise, backend=backend)
    for a, n in VALUES:
        _check(c, _pointwise, x, a, n)


class _Scaled(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = scale

    def forward(self, x):
        return torch.tanh(self.lin(x) * self.scale) * self.scale


def test_module_float_attribute_as_input(backend):
    """A second instance with another float attribute makes Dynamo pass it as an input (a 0-d
    tensor read by .item()), as BART's embed_scale."""
    x = torch.randn(4, 8)
    for scale in (2.0, 0.75, -1.25):
        torch.manual_seed(0)
        m = _Scaled(scale)
        ref = _Scaled(scale).double()
        ref.load_state_dict(m.state_dict())
        c = _dynamo(m, backend)
        xs = [x.clone().requires_grad_(True), x.clone().requires_grad_(True),
              x.double().requires_grad_(True)]
        outs = [c(xs[0]), m(xs[1]), ref(xs[2])]
        for o in outs:
            o.sum().backward()
        assert_policy("output", outs[0].detach(), outs[1].detach(), outs[2].detach())
        assert_policy("x grad", xs[0].grad, xs[1].grad, xs[2].grad)


def test_size_symints_with_dynamic_shapes(backend):
    """Automatic dynamic shapes hand over sizes as SymInt inputs: compiled per shape, the
    wrapper takes the size argument it baked in."""
    def f(x):
        return (x.view(x.shape[0], -1) * x.shape[0]).sin()
    c = _dynamo(f, backend)
    for n in (2, 3, 5):
        _check(c, f, torch.randn(n, 4, 2))


def test_tiny_bart(backend):
    transformers = pytest.importorskip("transformers")
    if backend == "triton":
        pytest.skip("BART under the Triton interpreter is slow; aten and cpp cover it")
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    for d_model in (32, 16):  # the second model's embed_scale/scaling come in as inputs
        cfg = transformers.BartConfig(
            vocab_size=100, d_model=d_model, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
            decoder_ffn_dim=64, max_position_embeddings=64, scale_embedding=True, dropout=0.0,
            attention_dropout=0.0, activation_dropout=0.0)
        torch.manual_seed(0)
        m = transformers.BartForConditionalGeneration(cfg)
        ref = transformers.BartForConditionalGeneration(cfg).double()
        ref.load_state_dict(m.state_dict())
        loss = _dynamo(m, backend)(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}
        m.zero_grad()
        eager = m(input_ids=ids, labels=ids).loss
        eager.backward()
        r = ref(input_ids=ids, labels=ids).loss
        r.backward()
        assert_policy("loss", loss.detach(), eager.detach(), r.detach())
        refs = dict(ref.named_parameters())
        for k, p in m.named_parameters():
            if p.grad is not None:
                assert_policy(f"grad {k}", grads[k], p.grad, refs[k].grad)
