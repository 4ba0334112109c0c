"""Transposing pointwise kernels (read along one dim, write along another) print as 2-D tiles
(codegen/triton/transpose.py) and give eager's bits; shapes that do not tile stay 1-D."""
import pytest
import torch

from triton_helpers import DEVICE, check


def _silu_mul_t(a, b):
    return (a * torch.nn.functional.silu(b)).t().contiguous()


def _tiles(c) -> bool:
    return "tile = " in c.source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transposed_pointwise_is_tiled_and_exact(dtype):
    a, b = (torch.randn(256, 320, dtype=dtype) for _ in range(2))
    exact = dtype == torch.bfloat16  # float32: the interpreter's exp is NumPy's, not eager's
    c = check(_silu_mul_t, a, b, **({"rtol": 0, "atol": 0} if exact else {}))
    assert _tiles(c)


def test_transpose_of_middle_dims_with_outer_dims():
    x = torch.randn(3, 64, 5, 352)
    c = check(lambda t: (t.exp() + 1).permute(0, 3, 2, 1).contiguous(), x)
    assert _tiles(c)


def test_untileable_or_plain_shapes_stay_1d():
    odd = torch.randn(250, 330)
    assert not _tiles(check(lambda t: (t * 2).t().contiguous(), odd, rtol=0, atol=0))
    rows = torch.randn(512, 256)
    scale = torch.randn(512, 1)
    assert not _tiles(check(lambda t, s: t * s.sigmoid(), rows, scale))
    small = torch.randn(64, 64)
    assert not _tiles(check(lambda t: (t + 1).t().contiguous(), small, rtol=0, atol=0))
