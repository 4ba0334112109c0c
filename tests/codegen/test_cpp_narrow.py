"""C++ int32 index values: max-pool window positions and aranges whose bounds fit in int32 are
computed, selected and compared as int32 (codegen/cpp/narrow.py); results equal eager's,
gradients and integer outputs included."""
import pathlib

import pytest
import torch
import torch.nn.functional as F

from cpp_helpers import check
from trainc.testing import assert_grads_match


def _pool(x):
    out, idx = F.max_pool2d_with_indices(x.relu(), 2)
    return out * 2, idx, idx * 3 + 1  # int64 arithmetic on the indices


@pytest.mark.parametrize("shape", [(2, 16, 8, 8), (1, 3, 7, 9)])
def test_pool_indices_compare_in_int32(shape, tmp_path):
    x = torch.randn(*shape)
    x[0, 0, 0, :2] = 1.0  # ties: the first position wins
    x[0, 1 % shape[1], 1, 1] = float("nan")
    x.requires_grad_(True)
    assert_grads_match(_pool, [x], backend="cpp", debug_dir=str(tmp_path),
                       cache_artifacts=False)
    src = "".join(p.read_text() for p in pathlib.Path(tmp_path).rglob("3*_wrapper.py"))
    assert "const int32_t t" in src


def test_arithmetic_on_int32_indices_widens_first():
    def f(x):  # up to 3e9: the arange may be int32, the product may not
        v = torch.arange(x.shape[0]) * 1_000_000_000 + x.argmax(-1)
        return v, v == 3_000_000_005
    x = torch.randn(4, 6)
    x[3, 5] = 10.0
    cg = check(f, x)
    assert "((int64_t)t" in cg.extra["cpp"]
