"""compile_pool: warmup jobs described for worker processes; failed workers are harmless."""
import functools
import textwrap

import pytest
import torch

from trainc.codegen.triton.compile_pool import job_spec, warm_disk_cache
from trainc.codegen.triton.launch import load_module
from trainc.config import Config

SOURCE = textwrap.dedent('''
    import triton
    import triton.language as tl

    @triton.jit
    def double(x_ptr, y_ptr, XBLOCK: tl.constexpr):
        i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        tl.store(y_ptr + i, tl.load(x_ptr + i) * 2)
''')


def test_job_spec_names_module_function_dtypes_and_meta(tmp_path):
    mod, path = load_module(SOURCE, Config(cache_dir=str(tmp_path)))
    job = functools.partial(mod.double.warmup, torch.bfloat16, torch.float32, grid=(1,),
                            XBLOCK=64, num_warps=4)
    assert job_spec(job) == (path, "double", ("bfloat16", "float32"),
                             {"XBLOCK": 64, "num_warps": 4})
    assert job_spec(lambda: None) is None


def test_failing_workers_compile_nothing_and_return():
    specs = [("/nonexistent/k.py", "double", ("float32",), {"XBLOCK": 64})] * 3
    assert warm_disk_cache(specs, 2, timeout=120) == 0
    assert warm_disk_cache(specs[:1], 4) == 0  # one job: compiled in process, no workers


@pytest.fixture(autouse=True)
def _no_idle_workers():
    """Each test starts and ends without the workers an earlier block left idle."""
    from trainc.codegen.triton import compile_pool
    compile_pool.shutdown()
    yield
    compile_pool.shutdown()


def test_workers_started_for_a_graph_serve_each_batch_then_exit(monkeypatch):
    """compile_pool.workers(n): the same processes answer every batch inside the block (the
    forward's and the backward's kernels), then (idle past KEEP_IDLE_SECONDS) get end of
    input and exit."""
    from trainc.codegen.triton import compile_pool
    monkeypatch.setattr(compile_pool, "KEEP_IDLE_SECONDS", 0.0)
    specs = [("/nonexistent/k.py", "double", ("float32",), {"XBLOCK": 64})] * 3
    with compile_pool.workers(2):
        active = compile_pool._active
        assert len(active.ins) == 2
        assert warm_disk_cache(specs, 2) == 0  # answered "failed": nothing compiled
        assert warm_disk_cache(specs, 2) == 0
        assert active.proc.poll() is None  # still serving
        with compile_pool.workers(2):  # nested: shares them
            assert compile_pool._active is active
    assert compile_pool._active is None
    assert active.proc.wait(timeout=60) == 0  # its forked workers exited too


def test_workers_that_cannot_start_leave_compiles_in_process(monkeypatch):
    """A worker process that cannot be started (no processes left) is not an error: the
    kernels compile in process."""
    import subprocess
    from trainc.codegen.triton import compile_pool

    def refuse(*a, **k):
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    specs = [("/nonexistent/k.py", "double", ("float32",), {"XBLOCK": 64})] * 3
    with compile_pool.workers(2):
        assert compile_pool._active.ins == []
        assert warm_disk_cache(specs, 2) == 0
    assert warm_disk_cache(specs, 2) == 0


def test_worker_script_imports_torch_and_triton_but_not_trainc():
    """Workers start as a script: importing the trainc package cost ~4 s per worker (H200 host)
    before its first compile; modules of the script's own folder must not shadow others."""
    import subprocess
    import sys
    from trainc.codegen.triton.compile_pool import WORKER
    out = subprocess.run([sys.executable, "-X", "importtime", WORKER], input="",
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    mods = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()
            if line.startswith("import time:")}
    assert {"torch", "triton"} <= mods
    assert not {m.split(".")[0] for m in mods} & {"trainc", "launch", "printer", "exprs", "split"}


def test_submit_queues_round_robin_and_dead_workers_fail_their_jobs():
    """Workers.submit queues and returns (the lead goes on generating code), round robin from
    where the last batch stopped; jobs queued on workers that died resolve as failed at once,
    not at the timeout."""
    import time
    from trainc.codegen.triton.compile_pool import Workers
    specs = [("/nonexistent/k.py", "double", ("float32",), {"XBLOCK": 64})] * 3
    pool = Workers(2)
    try:
        jobs = pool.submit(specs)
        assert [k for k, _ in jobs] == [0, 1, 0]
        assert pool.wait(jobs, timeout=200) == 0
        assert [k for k, _ in pool.submit(specs[:1])] == [1]
        pool.kill()
        pool.proc.wait(timeout=60)
        t0 = time.monotonic()
        jobs = pool.submit(specs)
        assert pool.wait(jobs, timeout=200) == 0
        assert time.monotonic() - t0 < 100
        assert all(f.done() and f.result() is False for _, f in jobs)
    finally:
        pool.close()


def test_the_next_graph_reuses_idle_workers(monkeypatch):
    """A graph's workers stay idle for the next graph (graph breaks: each new set imports torch
    for seconds before its first compile) if it wants no more of them and none died; a larger
    set replaces them; idle ones exit after KEEP_IDLE_SECONDS."""
    from trainc.codegen.triton import compile_pool
    specs = [("/nonexistent/k.py", "double", ("float32",), {"XBLOCK": 64})] * 2
    with compile_pool.workers(3):
        first = compile_pool._active
    with compile_pool.workers(2):
        assert compile_pool._active is first
        assert warm_disk_cache(specs, 2) == 0  # they still answer
    with compile_pool.workers(4):  # more wanted: a new set; the old one ends
        second = compile_pool._active
        assert second is not first and len(second.ins) == 4
    assert first.proc.wait(timeout=60) == 0
    second.kill()  # dead: not reused
    second.proc.wait(timeout=60)
    with compile_pool.workers(2):
        third = compile_pool._active
        assert third is not second and third.alive()
    monkeypatch.setattr(compile_pool, "KEEP_IDLE_SECONDS", 0.1)
    with compile_pool.workers(2):
        assert compile_pool._active is third
    assert third.proc.wait(timeout=60) == 0  # idle past the limit: ended
    assert compile_pool._idle is None
