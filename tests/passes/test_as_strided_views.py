"""as_strided_views: row-major as_strided / as_strided_scatter of dense tensors become views,
slices and slice_scatters (bit-identical values); other strided views stay as they are."""
from __future__ import annotations

import torch

import trainc
from test_joint_passes import _targets
from trainc.passes import as_strided_views

aten = torch.ops.aten


def _trace(fn, *shapes):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        return make_fx(fn)(*(torch.empty(s) for s in shapes))


def _rows(x):  # rows 1-4 of a [6, 8] tensor, and the whole of it with size-1 dims' strides
    return torch.as_strided(x, (4, 8), (8, 1), 8) * 2, torch.as_strided(x, (6, 1, 8), (8, 99, 1))


def _columns(x):  # not row-major: stays
    return torch.as_strided(x, (8, 6), (1, 8)) * 2


def _scatters(x, y):
    return (torch.zeros(48).as_strided_scatter(x.t(), (8, 6), (6, 1)),
            torch.zeros(6, 8).as_strided_scatter(y, (2, 8), (8, 1), 16))


def test_row_major_views_become_views_and_slices():
    x = torch.randn(6, 8)
    gm = as_strided_views(_trace(_rows, (6, 8)))
    assert aten.as_strided.default not in _targets(gm) and aten.slice.Tensor in _targets(gm)
    for got, want in zip(gm(x), _rows(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_other_strides_stay_as_strided():
    gm = as_strided_views(_trace(_columns, (6, 8)))
    assert aten.as_strided.default in _targets(gm)


def test_scatters_become_views_and_slice_scatters():
    x, y = torch.randn(6, 8), torch.randn(2, 8)
    gm = as_strided_views(_trace(_scatters, (6, 8), (2, 8)))
    assert aten.as_strided_scatter.default not in _targets(gm)
    assert aten.slice_scatter.default in _targets(gm)
    for got, want in zip(gm(x, y), _scatters(x, y)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_adaptive_avg_pool1d_compiles_without_fallbacks_and_matches_eager():
    """Swin's pooler: AdaptiveAvgPool1d(1) decomposes through as_strided and its backward
    through as_strided_scatter (cpp backend)."""
    torch._dynamo.reset()
    pool = torch.nn.AdaptiveAvgPool1d(1)
    x = torch.randn(2, 16, 9, requires_grad=True)

    def f(x):
        return (pool(x.transpose(1, 2)).flatten(1) ** 2).sum()

    without = trainc.explain(f, x, backend="cpp", skip_passes=("joint:as_strided_views",))
    assert "aten.as_strided_scatter.default" in without.fallback_ops, without.fallback_ops
    torch._dynamo.reset()
    ex = trainc.explain(f, x, backend="cpp")
    assert not ex.fallback_ops, ex.fallback_ops
    torch._dynamo.reset()
    got = trainc.compile(f, backend="cpp")(x)
    got.backward()
    g = x.grad.clone()
    x.grad = None
    want = f(x)
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(g, x.grad)
