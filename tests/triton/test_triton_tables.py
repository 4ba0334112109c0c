"""Config.triton_lookup_tables: GELU and its derivative of 16-bit values read from tables of
eager's own results for all 65536 values (codegen/triton/tables.py). Under TRITON_INTERPRET
on CPU the tables come from eager's CPU kernels, natively from the GPU's."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import trainc
from policy import assert_policy
from torch.fx.experimental.proxy_tensor import make_fx

from trainc import decomps
from trainc.codegen.triton import TritonBackend
from trainc.codegen.triton.tables import table
from trainc.config import make_config
from triton_helpers import DEVICE


def compile_triton(fn, *args, **options):
    """As triton_helpers.compile_triton, traced as trainc.compile traces with the options
    (with lookup tables on, the exact GELU's backward stays one op)."""
    config = make_config(**options)
    gm = make_fx(lambda *a: tuple(fn(*a)) if isinstance(fn(*a), tuple) else (fn(*a),),
                 decomposition_table=decomps.table_for(config, "triton"),
                 tracing_mode="fake")(*args)
    return TritonBackend(config).compile(gm, list(args))

SPECIAL = [0.0, -0.0, 1e-30, -5.0, 5.0, 100.0, -100.0, float("inf"), float("-inf"),
           float("nan")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tables_hold_eager_results_for_every_16_bit_value(dtype):
    codes = torch.arange(1 << 16, dtype=torch.int32)
    x = (codes - ((codes >> 15) << 16)).to(torch.int16).view(dtype).to(DEVICE)
    values = table("gelu", dtype, x.device)
    assert values.dtype == dtype and values.shape == (1 << 16,)
    want = F.gelu(x)
    assert torch.equal(values.isnan(), want.isnan())
    assert torch.equal(values[~want.isnan()].view(torch.int16), want[~want.isnan()].view(torch.int16))
    grads = table("gelu_grad", dtype, x.device)
    one = torch.ones(1 << 16, device=DEVICE)
    assert grads.dtype == torch.float32
    want_grad = torch.ops.aten.gelu_backward(one, x.float())
    assert torch.equal(grads.nan_to_num(7.0), want_grad.nan_to_num(7.0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gelu_by_table_gives_eager_bits(dtype):
    """Forward: eager's bits, special values included; backward: eager's (the table holds
    the float32 derivative eager multiplies the gradient by)."""
    x = torch.cat([torch.randn(200), torch.tensor(SPECIAL)]).to(dtype).to(DEVICE)
    g = torch.randn_like(x)
    fn = lambda x, g: (F.gelu(x), torch.ops.aten.gelu_backward(g, x))
    c = compile_triton(fn, x, g, triton_lookup_tables=True)
    lookup = "bitcast=True) >> 16" if dtype == torch.bfloat16 else "to(tl.int16, bitcast=True)"
    assert lookup in c.extra["triton"] and "tl.erf(t" not in c.extra["triton"]
    y, dx = c.run([x, g])
    ye, dxe = fn(x, g)
    nan = ye.isnan()  # NaN where eager's is (its sign and payload vary even within eager: CPU
    assert torch.equal(y.isnan(), nan)  # kernels run a vector and a scalar path)
    assert torch.equal(y[~nan].view(torch.int16), ye[~nan].view(torch.int16))
    assert torch.equal(dx.nan_to_num(7.0), dxe.nan_to_num(7.0))


def test_float32_gelu_is_computed_and_tanh_gelu_looked_up():
    """float32 keeps the computed form; the tanh approximation of a bf16 value is a table too
    (its backward decomposes, as without tables)."""
    x = torch.randn(64, device=DEVICE)
    c = compile_triton(lambda x: F.gelu(x), x, triton_lookup_tables=True)
    assert "bitcast=True) >> 16" not in c.extra["triton"]
    torch.testing.assert_close(c.run([x])[0], F.gelu(x), rtol=1e-6, atol=1e-7)
    xb = torch.cat([torch.randn(64), torch.tensor(SPECIAL[:-3])]).bfloat16().to(DEVICE)
    fn = lambda x: F.gelu(x, approximate="tanh")
    c = compile_triton(fn, xb, triton_lookup_tables=True)
    assert "bitcast=True) >> 16" in c.extra["triton"]
    assert torch.equal(c.run([xb])[0].view(torch.int16), fn(xb).view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_model_with_lookup_tables_matches_eager(dtype):
    """End to end (trainc.compile, the backward traced with gelu_backward whole): the policy
    against float64, and eager's bits for the output."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 16), nn.GELU()).to(DEVICE)
    r = copy.deepcopy(m).double()
    m = m.to(dtype)
    e = copy.deepcopy(m)
    torch._dynamo.reset()
    c = trainc.compile(m, backend="triton", triton_lookup_tables=True)
    x = torch.randn(24, 32, device=DEVICE)
    xc, xe, xr = (x.clone().to(dt).requires_grad_() for dt in (dtype, dtype, torch.double))
    outs = [fn(xi) for fn, xi in ((c, xc), (e, xe), (r, xr))]
    assert torch.equal(outs[0], outs[1])
    for o in outs:
        o.float().pow(2).sum().backward()
    assert_policy("x.grad", xc.grad, xe.grad, xr.grad)
    for (name, p), q, s in zip(m.named_parameters(), e.parameters(), r.parameters()):
        assert_policy(name, p.grad, q.grad, s.grad)
