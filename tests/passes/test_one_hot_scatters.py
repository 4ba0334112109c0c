"""one_hot_scatters: scatter of zeros with one index per row becomes where(iota == index)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import trainc
from test_joint_passes import _targets
from trainc.passes import one_hot_scatters

aten = torch.ops.aten


def _trace(fn, x_shape, idx_shape):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        return make_fx(fn)(torch.empty(x_shape), torch.zeros(idx_shape, dtype=torch.long))


def _scatter_rows(x, idx):
    return torch.zeros_like(x).scatter(1, idx, -2.5) * x


def test_one_index_per_row_becomes_a_comparison_with_the_same_values():
    x, idx = torch.randn(6, 11), torch.randint(0, 11, (6, 1))
    gm = _trace(_scatter_rows, (6, 11), (6, 1))
    assert aten.scatter.value in _targets(gm)
    gm = one_hot_scatters(gm)
    assert aten.scatter.value not in _targets(gm) and aten.arange.default in _targets(gm)
    torch.testing.assert_close(gm(x, idx), _scatter_rows(x, idx), rtol=0, atol=0)


def test_several_indices_per_row_or_fewer_rows_stay_scatters():
    for shape in ((6, 2), (3, 1)):
        gm = one_hot_scatters(_trace(_scatter_rows, (6, 11), shape))
        assert aten.scatter.value in _targets(gm), shape


def test_cross_entropy_with_ignored_labels_matches_eager():
    """The pattern cross_entropy's backward makes, through the compiler (cpp)."""
    torch._dynamo.reset()
    logits = torch.randn(9, 37, requires_grad=True)
    labels = torch.randint(0, 37, (9,))
    labels[2] = -100

    def f(z, y):
        return F.cross_entropy(z.float(), y, ignore_index=-100)

    ref = logits.detach().clone().requires_grad_(True)
    f(ref, labels).backward()
    out = trainc.compile(f, backend="cpp")(logits, labels)
    out.backward()
    torch.testing.assert_close(logits.grad, ref.grad)
    assert float(logits.grad[2].abs().sum()) == 0.0
