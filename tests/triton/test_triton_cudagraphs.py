"""options={"cudagraphs": True}: refused with a clear error on CPU; on CUDA (gpu mark) a compiled
model and a compile_step replay CUDA graphs and match the runs without them."""
import copy

import pytest
import torch

import trainc


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


@pytest.mark.parametrize("backend", ["cpp", "aten"])
def test_cudagraphs_is_refused_on_cpu(backend):
    fn = trainc.compile(_mlp(), backend=backend, cudagraphs=True)
    with pytest.raises(trainc.UnsupportedError, match="cudagraphs=True .* needs CUDA tensors"):
        fn(torch.randn(3, 16))
    opt_model = _mlp()
    step = trainc.compile_step(opt_model, lambda m, x: m(x).sum(),
                               torch.optim.SGD(opt_model.parameters(), lr=0.1),
                               backend=backend, cudagraphs=True)
    with pytest.raises(trainc.UnsupportedError, match="needs CUDA tensors"):
        step(torch.randn(3, 16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cudagraphs_replay_matches_plain_runs_on_gpu():
    model = _mlp().cuda()
    ref = copy.deepcopy(model)
    g_fn = trainc.compile(model, backend="triton", cudagraphs=True)
    r_fn = trainc.compile(ref, backend="triton")
    for i in range(4):  # run, capture, replay, replay with a new batch
        x = torch.randn(8, 16, device="cuda")
        a, b = g_fn(x), r_fn(x)
        a.square().sum().backward()
        b.square().sum().backward()
        torch.testing.assert_close(a, b)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    m2 = _mlp().cuda()
    r2 = copy.deepcopy(m2)  # the same initial weights: the two steps must agree
    lf = lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)
    s1 = trainc.compile_step(m2, lf, torch.optim.AdamW(m2.parameters(), lr=1e-2),
                             backend="triton", cudagraphs=True)
    s2 = trainc.compile_step(r2, lf, torch.optim.AdamW(r2.parameters(), lr=1e-2),
                             backend="triton")
    ptrs = [p.data_ptr() for p in m2.parameters()]
    for i in range(5):
        x, y = torch.randn(8, 16, device="cuda"), torch.randn(8, 4, device="cuda")
        torch.testing.assert_close(s1(x, y), s2(x, y))
    for p, q in zip(m2.parameters(), r2.parameters()):
        torch.testing.assert_close(p, q)
    assert [p.data_ptr() for p in m2.parameters()] == ptrs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cudagraphs_peak_counts_the_private_pool_on_gpu():
    """A replay allocates almost nothing; the graph's private pool holds its buffers between
    calls, and peak_bytes must count it (at least the plain run's peak)."""
    from trainc.report import peak_bytes
    lf = lambda m, x, y: torch.nn.functional.mse_loss(m(x), y)
    x, y = torch.randn(256, 16, device="cuda"), torch.randn(256, 4, device="cuda")
    peaks = {}
    for graphs in (False, True):
        m = _mlp().cuda()
        step = trainc.compile_step(m, lf, torch.optim.SGD(m.parameters(), lr=1e-2),
                                   backend="triton", cudagraphs=graphs)
        for _ in range(3):
            step(x, y)
        peaks[graphs] = peak_bytes(lambda: step(x, y), torch.device("cuda"))
    assert peaks[True] >= peaks[False] > 0
