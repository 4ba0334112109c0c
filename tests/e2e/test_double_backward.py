"""Second-order gradients through trainc: create_graph=True raises trainc.UnsupportedError
(never a silent first-order answer); first-order gradients still pass float64 gradcheck."""
import pytest
import torch
import torch.nn as nn

import trainc


@pytest.fixture(params=["aten", "cpp"])
def backend(request):
    torch._dynamo.reset()
    return request.param


def _f(x, w):
    return (torch.tanh(x @ w) ** 2).sum()


def _inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(3, 4, generator=g, dtype=dtype).requires_grad_(True),
            torch.randn(4, 2, generator=g, dtype=dtype).requires_grad_(True))


@pytest.mark.parametrize("entry", ["trainc", "torch"])
def test_create_graph_raises(backend, entry):
    c = trainc.compile(_f, backend=backend) if entry == "trainc" else \
        torch.compile(_f, backend="trainc", options={"backend": backend})
    x, w = _inputs()
    with pytest.raises(trainc.UnsupportedError, match="create_graph=True"):
        torch.autograd.grad(c(x, w), (x, w), create_graph=True)
    with pytest.raises(trainc.UnsupportedError, match="double backward"):
        c(x, w).backward(create_graph=True)
    with pytest.raises(trainc.UnsupportedError):  # eager ops after the compiled region too
        torch.autograd.grad(c(x, w).exp(), x, create_graph=True)


def test_create_graph_raises_for_module(backend):
    m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1)).double()
    c = trainc.compile(m, backend=backend)
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(trainc.UnsupportedError, match="eager"):
        (gx,) = torch.autograd.grad(c(x).sum(), x, create_graph=True)
        gx.pow(2).sum().backward()  # a gradient penalty: must not run on a first-order graph


def test_first_order_still_matches_gradcheck(backend):
    c = trainc.compile(_f, backend=backend)
    assert torch.autograd.gradcheck(c, _inputs(), eps=1e-6, atol=1e-8)
    x, w = _inputs()
    gx, gw = torch.autograd.grad(c(x, w), (x, w))
    ex, ew = torch.autograd.grad(_f(x, w), (x, w))
    torch.testing.assert_close((gx, gw), (ex, ew), rtol=1e-12, atol=1e-12)
