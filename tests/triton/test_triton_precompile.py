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


def test_step_kernels_see_aligned_pointers_as_precompiled(monkeypatch):
    """compile_step with AdamW: every launch gets 16-byte aligned pointers, the specialization
    precompile compiled (the per-parameter step counts are uploaded packed; unaligned views
    made a quarter of gpt's kernels compile again, serially, at their first launch)."""
    import trainc
    import trainc.codegen.triton.launch as L
    unaligned = []
    real = L.Launcher.__call__

    def call(self, *args):
        unaligned.extend(self.ks.name for a in args if a.is_cuda and a.data_ptr() % 16)
        return real(self, *args)
    monkeypatch.setattr(L.Launcher, "__call__", call)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4),
                            torch.nn.LayerNorm(4)).cuda()
    step = trainc.compile_step(m, lambda m, x: m(x).square().mean(),
                               torch.optim.AdamW(m.parameters(), lr=1e-3), backend="triton")
    for _ in range(3):
        step(torch.randn(8, 16, device="cuda"))
    assert not unaligned


def test_worker_processes_compile_warmup_jobs(tmp_path):
    """The worker processes of compile_pool compile real jobs on a CUDA machine."""
    import functools
    from test_triton_compile_pool import SOURCE
    from trainc.codegen.triton.compile_pool import job_spec, warm_disk_cache
    from trainc.codegen.triton.launch import load_module
    from trainc.config import Config
    torch.zeros(1, device="cuda")  # CUDA initialized: the workers get this GPU's target
    mod, _ = load_module(SOURCE, Config(cache_dir=str(tmp_path)))
    specs = [job_spec(functools.partial(mod.double.warmup, torch.float32, torch.float32,
                                        grid=(1,), XBLOCK=x)) for x in (64, 128, 256)]
    assert warm_disk_cache(specs, 2) == 3


def test_workers_of_one_graph_compile_several_batches(tmp_path):
    """The workers a graph's compile starts (compile_pool.workers) compile real jobs in
    every batch they get."""
    import functools
    from test_triton_compile_pool import SOURCE
    from trainc.codegen.triton import compile_pool
    from trainc.codegen.triton.launch import load_module
    from trainc.config import Config
    mod, _ = load_module(SOURCE, Config(cache_dir=str(tmp_path)))
    spec = lambda x, d: compile_pool.job_spec(functools.partial(  # noqa: E731
        mod.double.warmup, d, d, grid=(1,), XBLOCK=x))
    with compile_pool.workers(2):
        assert compile_pool.warm_disk_cache([spec(x, torch.float32) for x in (64, 128)], 2) == 2
        assert compile_pool.warm_disk_cache([spec(x, torch.float16) for x in (64, 128)], 2) == 2
