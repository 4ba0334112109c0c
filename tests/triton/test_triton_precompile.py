"""On CUDA, a graph's kernels compile concurrently at compile time (launch.precompile) and the
first run launches them without compiling again; results match eager."""
import pytest
import torch

from triton_helpers import check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_kernels_precompile_concurrently_and_run():
    def f(a, b):
        return (torch.softmax(a, 1), a.sum(0), (a * b).relu(), torch.var_mean(b, 1)[0],
                a.sum())
    c = check(f, torch.randn(64, 300), torch.randn(64, 300), rtol=1e-4, atol=1e-5)
    assert c.extra["precompiled"] >= len(c.kernels) >= 3
