"""On CUDA, launches after the first call a kernel's compiled launcher directly
(Launcher._run, `triton_fast_launch`): results equal the JIT path's, including when an input's
alignment changes (a new specialization goes through the JIT again), split and scatter kernels
and CUDA-graph capture."""
import pytest
import torch

import trainc
from trainc.codegen.triton import launch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def f(a, idx, b):
    out = torch.zeros(16, a.shape[1], device=a.device).index_add(0, idx, a)  # scatter
    return torch.softmax(a, 1), a.sum(), (a * b).relu().sum(0), out  # split + reductions


def _inputs(offset: int):
    base = torch.randn(64 * 300 + offset, device="cuda")
    a = base[offset:].view(64, 300)  # offset 1: not 16-byte aligned
    return a, torch.randint(0, 16, (64,), device="cuda"), torch.randn(64, 300, device="cuda")


@pytest.mark.parametrize("cudagraphs", [False, True])
def test_fast_launches_match_the_jit_path(cudagraphs):
    fast = trainc.compile(f, backend="triton", cudagraphs=cudagraphs)
    slow = trainc.compile(f, backend="triton", triton_fast_launch=False)
    seen = []
    orig = launch.Launcher._run
    launch.Launcher._run = lambda self, *a: (seen.append(self), orig(self, *a))[1]
    try:
        for offset in (0, 0, 0, 1, 1, 0):
            args = _inputs(offset)
            for x, y in zip(fast(*args), slow(*args)):
                if cudagraphs:  # the replay reads a copy of `a` (aligned): another Triton
                    # specialization, another summation order for a.sum()
                    torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
                else:
                    torch.testing.assert_close(x, y)  # index_add: atomics
    finally:
        launch.Launcher._run = orig
    fast_ones = {id(s) for s in seen if s.config.triton_fast_launch and s._bins}
    assert fast_ones, "no launcher kept a compiled kernel"


def test_fast_launches_run_on_the_callers_stream():
    """The wrapper looks the stream up once per call (launch.begin_call): kernels launched on a
    side stream must wait for work queued before them there (a launch on the default stream
    would read `a` before the delayed copy writes it)."""
    fn = trainc.compile(lambda a: (a * 2).sum(1), backend="triton")
    src = torch.randn(512, 4096, device="cuda")
    a = torch.zeros_like(src)
    for _ in range(3):  # the first call takes the JIT path; later calls the fast one
        fn(a)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~tens of ms: the copy lands long after the launch
        a.copy_(src)
        out = fn(a)
    side.synchronize()
    torch.testing.assert_close(out, (src.double() * 2).sum(1).float(), rtol=1e-4, atol=1e-3)
    assert getattr(launch._call, "ctx", None) is None  # reset when the call returned
