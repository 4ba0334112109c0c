"""compile_pool: warmup jobs described for worker processes; failed workers are harmless."""
import functools
import json
import os
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


def test_worker_script_imports_triton_only():
    """Workers start as a script that imports Triton alone: importing the trainc package cost
    ~4 s per worker (H200 host) and torch ~4.5 s before the first compile; modules of the
    script's own folder must not shadow others."""
    import subprocess
    import sys
    from trainc.codegen.triton.compile_pool import WORKER
    out = subprocess.run([sys.executable, "-X", "importtime", WORKER], input="",
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    mods = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()
            if line.startswith("import time:")}
    assert "triton" in mods
    assert not {m.split(".")[0] for m in mods} & {"torch", "trainc", "launch", "printer",
                                                   "exprs", "split"}


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


def test_a_target_line_is_not_a_job(tmp_path):
    """The lead may first send its GPU target ({"target": ...}: workers compile for it without
    creating a CUDA context); it gets no answer, and a worker that cannot use it (no GPU here)
    still answers every job in order."""
    import io
    from trainc.codegen.triton.compile_worker import serve
    k = tmp_path / "k.py"
    k.write_text("class _K:\n    def warmup(self, *a, grid, **kw):\n        return None\n"
                 "double = _K()\n")
    jobs = ['{"target": ["cuda", 90, 32]}\n', f'["{k}", "double", ["float32"], {{}}]\n',
            '["/nonexistent/k.py", "double", ["float32"], {}]\n']
    answers = io.StringIO()
    serve(jobs, answers)
    lines = answers.getvalue().splitlines()
    assert lines[0] == "ok" and lines[1].startswith("failed") and len(lines) == 2


BF16_SOURCE = textwrap.dedent('''
    import triton
    import triton.language as tl

    @triton.jit
    def mixed(x_ptr, m_ptr, y_ptr, XBLOCK: tl.constexpr):
        i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        v = tl.load(x_ptr + i).to(tl.float32) * 2
        tl.store(m_ptr + i, v > 0)
        tl.store(y_ptr + i, v.to(y_ptr.dtype.element_ty))
''')


LEAD = textwrap.dedent('''
    import importlib.util, json, sys
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    class Target:  # answers as the lead's CUDA driver does on an H100/H200
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    driver.set_active(Target())
    spec = importlib.util.spec_from_file_location("mixed_kernels", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for x, y in json.loads(sys.argv[2]):
        mod.mixed.warmup(getattr(torch, x), torch.bool, getattr(torch, y), grid=(1,),
                         XBLOCK=128, num_warps=4)
''')


def test_torchless_workers_fill_the_cache_entries_a_torch_warmup_uses(tmp_path):
    """Workers given the lead's target compile without importing torch (stand-in dtypes, a
    driver answering from the target) into the Triton cache entries that the lead's own
    warmup with torch dtypes then finds: no compile happens in the lead. Compiles for sm_90
    (Triton's bundled ptxas; no GPU needed), in subprocesses: this process runs Triton's
    interpreter. Stand-ins made per job once compiled stale types: Triton caches a type
    string per dtype object, and a new object can reuse a freed one's id."""
    import subprocess
    import sys
    from trainc.codegen.triton.compile_pool import WORKER
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    path = str(tmp_path / "mixed_kernels.py")
    with open(path, "w") as f:
        f.write(BF16_SOURCE)
    pairs = [(x, y) for x in ("bfloat16", "float32", "float16") for y in ("float32", "bfloat16",
                                                                          "float16")]
    jobs = [[path, "mixed", [x, "bool", y], {"XBLOCK": 128, "num_warps": 4}] for x, y in pairs]
    lines = ['{"target": ["cuda", 90, 32]}'] + [json.dumps(j) for j in jobs]
    code = ("import runpy, sys; w = sys.argv.pop(); runpy.run_path(w, run_name='__main__'); "
            "print(hasattr(sys.modules.get('torch'), 'cuda'), file=sys.stderr)")  # real torch?
    out = subprocess.run([sys.executable, "-c", code, WORKER], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, timeout=300, env=env)
    if out.stdout.splitlines() != ["ok"] * len(jobs):
        pytest.skip(f"this Triton cannot compile for sm_90 here: {out.stdout[:300]}")
    assert out.stderr.strip().splitlines()[-1] == "False", out.stderr[-500:]  # no torch
    cache = tmp_path / "cache"
    kernels = sorted(p.name for p in cache.iterdir() if any(p.glob("*.cubin")))
    assert len(kernels) == len(jobs), "a job compiled another job's specialization"
    lead = subprocess.run([sys.executable, "-c", LEAD, path, json.dumps(pairs)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert lead.returncode == 0, lead.stderr[-2000:]
    assert sorted(p.name for p in cache.iterdir() if any(p.glob("*.cubin"))) == kernels


STALE_LEAD = LEAD.replace("driver.set_active(Target())\n", textwrap.dedent('''
    import os
    from triton.backends.nvidia.compiler import get_ptxas_version
    from trainc.codegen.triton import compile_pool
    get_ptxas_version(90)  # the lead hashed once (torch.compile does, for its cache key) ...
    for tool in ("PTXAS", "PTXAS_BLACKWELL"):  # ... then pointed Triton at another ptxas (3.9
        os.environ[f"TRITON_{tool}_PATH"] = sys.argv[3]  # runs ptxas-blackwell for sm_90)
    compile_pool._lead_target = lambda: ["cuda", 90, 32]
    workers = compile_pool.Workers(2)
    specs = [(sys.argv[1], "mixed", (x, "bool", y), {"XBLOCK": 128, "num_warps": 4})
             for x, y in json.loads(sys.argv[2])]
    assert workers.compile(specs) == len(specs), workers.errors
    workers.close()
    print(sorted(os.listdir(os.environ["TRITON_CACHE_DIR"])))
    driver.set_active(Target())
''')) + "print(sorted(os.listdir(os.environ['TRITON_CACHE_DIR'])))\n"


def test_workers_hash_with_the_ptxas_version_the_lead_cached(tmp_path):
    """Triton caches the ptxas version in its cache keys at its first compile; torch.compile
    then points TRITON_PTXAS_PATH at torch's ptxas. Workers started after that ran the other
    ptxas, so the lead missed every entry they wrote and compiled it all again (H200: 34
    kernels twice). Workers now hash with the lead's version string: no new entries."""
    import shutil
    import subprocess
    import sys
    from triton.backends.nvidia.compiler import get_ptxas_version  # noqa: F401 (CUDA backend)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",
                                                               "TRITON_PTXAS_PATH",
                                                               "TRITON_PTXAS_BLACKWELL_PATH")}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    path = str(tmp_path / "mixed_kernels.py")
    with open(path, "w") as f:
        f.write(BF16_SOURCE)
    real = subprocess.run([sys.executable, "-c", "from triton.backends.nvidia.compiler import "
                           "get_ptxas; print(get_ptxas(90).path)"], capture_output=True,
                          text=True, env=env).stdout.strip()
    if not real or not shutil.which(real):
        pytest.skip("no ptxas in this Triton")
    other = tmp_path / "ptxas"  # another ptxas: its --version names it
    other.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo "other ptxas"\nexec {real} "$@"\n')
    other.chmod(0o755)
    pairs = [("bfloat16", "float32"), ("float32", "bfloat16")]
    out = subprocess.run([sys.executable, "-c", STALE_LEAD, path, json.dumps(pairs), str(other)],
                         capture_output=True, text=True, timeout=300, env=env)
    if out.returncode != 0 and "cannot compile" in out.stderr:
        pytest.skip(out.stderr[-300:])
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = out.stdout.strip().splitlines()[-2:]
    assert len(eval(before)) >= len(pairs) and after == before


class _FakePool:
    """Stands in for a Workers set: records what is submitted."""

    def __init__(self):
        self.submitted, self.alive_now = [], True

    def alive(self):
        return self.alive_now

    def submit(self, specs):
        self.submitted.extend(specs)
        return []


def _two_config_kernel(tmp_path):
    """A launcher stand-in whose warmups compile one kernel at two configs."""
    mod, _ = load_module(SOURCE, Config(cache_dir=str(tmp_path)))

    class Kernel:
        def warmups(self):
            return [functools.partial(mod.double.warmup, torch.float32, torch.float32, grid=(1,),
                                      XBLOCK=x) for x in (64, 128)]
    return Kernel()


def test_a_small_graph_goes_to_the_workers_its_compile_started(monkeypatch, tmp_path):
    """Two jobs are too few to start processes for, but the workers started before tracing
    (compile_pool.workers) take them: the lead's threads compile one kernel at a time (H200
    normact: 4 jobs a graph, 2.3 s each graph in the lead)."""
    from trainc.codegen.triton import compile_pool, launch
    kernel, active = _two_config_kernel(tmp_path), _FakePool()
    monkeypatch.setattr(compile_pool, "_active", active)
    pending = launch.precompile([kernel], 8)
    assert len(active.submitted) == 2 and pending.batch is not None
    monkeypatch.setattr(compile_pool, "_active", None)  # none started: no new processes either
    monkeypatch.setattr(compile_pool, "_idle", None)
    assert launch.precompile([kernel], 8).batch.pool is None


def test_a_graph_compiled_after_the_others_goes_to_their_idle_workers(monkeypatch, tmp_path):
    """A graph compiled outside the `workers` block, such as the backward compiled again at
    its first call for tangents of other strides (an expanded gradient of a sum), goes to the
    workers kept idle since the last block (H200 normact float32: 4 jobs, 0.8 s in the
    lead's threads); a dead idle set is not used."""
    from trainc.codegen.triton import compile_pool, launch
    kernel, idle = _two_config_kernel(tmp_path), _FakePool()
    monkeypatch.setattr(compile_pool, "_active", None)
    monkeypatch.setattr(compile_pool, "_idle", idle)
    assert launch.precompile([kernel], 8).batch.pool is idle and len(idle.submitted) == 2
    idle.alive_now = False
    assert launch.precompile([kernel], 8).batch.pool is None


def test_the_lead_prepares_triton_while_workers_start(monkeypatch):
    """On CUDA the lead builds Triton's driver (its C utilities: gcc with a cold cache) and the
    hash of Triton's files that leads its cache keys in a thread started with the workers,
    beside the trace; a graph's first finish and launches wait for it (H200 normact: 0.5-0.9 s
    in the lead after the first graph's compiles)."""
    import threading
    import time
    from trainc.codegen.triton import compile_pool, launch
    loaded = threading.Event()

    def slow_load():
        time.sleep(0.3)
        loaded.set()

    monkeypatch.setattr(compile_pool, "_lead_prep", None)
    monkeypatch.setattr(compile_pool, "_prepare_triton", slow_load)
    monkeypatch.setattr(compile_pool, "_lead_target", lambda: ["cuda", 90, 32])
    monkeypatch.setattr(compile_pool, "_hashed_ptxas_version", lambda target: None)
    started = time.perf_counter()
    pool = compile_pool.Workers(0)
    assert time.perf_counter() - started < 0.2 and not loaded.is_set()  # not waited for here
    thread = compile_pool._lead_prep
    compile_pool.Workers(0).close()  # once per process
    assert compile_pool._lead_prep is thread
    launch.Precompile([], None, 0).finish()
    assert loaded.is_set()
    pool.close()


class _FakeWorkers:
    """Stands in for a started Workers set of `n`."""
    started = 0

    def __init__(self, n):
        _FakeWorkers.started += 1
        self.ins, self.closed = [None] * n, False

    def alive(self):
        return not self.closed

    def close(self):
        self.closed = True


def test_workers_started_at_compile_serve_the_first_graph(monkeypatch):
    """trainc.compile of a CUDA model starts the compile workers (codegen.prestart_workers), so
    they import Triton and hash its files during Dynamo's work before the first graph; the
    first graph's `workers` block takes that set; a second prestart starts none."""
    from trainc.codegen.triton import compile_pool
    monkeypatch.setattr(compile_pool, "Workers", _FakeWorkers)
    monkeypatch.setattr(compile_pool, "_active", None)
    monkeypatch.setattr(compile_pool, "_idle", None)
    _FakeWorkers.started = 0
    compile_pool.prestart(8)
    compile_pool.prestart(8)
    kept = compile_pool._idle
    assert _FakeWorkers.started == 1 and len(kept.ins) == 8
    with compile_pool.workers(5):
        assert compile_pool._active is kept
    assert _FakeWorkers.started == 1
    compile_pool.shutdown()
    assert kept.closed


def test_prestart_only_for_triton_on_cuda(monkeypatch):
    import trainc.codegen as codegen
    from trainc.codegen.triton import compile_pool
    seen = []
    monkeypatch.setattr(compile_pool, "prestart", seen.append)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    config = Config(triton_compile_workers=3)
    codegen.prestart_workers("auto", torch.device("cpu"), config)
    codegen.prestart_workers("aten", torch.device("cuda"), config)
    assert seen == []
    codegen.prestart_workers("auto", torch.device("cuda"), config)
    assert seen == [min(3, os.cpu_count() or 1)]
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter compiles nothing ahead
    codegen.prestart_workers("triton", torch.device("cuda"), config)
    assert len(seen) == 1


def test_a_background_compile_is_ready_only_with_its_kernels():
    """A backward compiled in the background (runtime.ExpandedBackwards) finishes its kernels'
    precompile in that thread (codegen/triton _FirstRun.prepare): H200 normact float32, the
    call after the first waited 0.9 s for them when only the codegen ran in the background."""
    import threading
    from trainc.codegen import CompiledGraph
    from trainc.codegen.triton import _FirstRun
    from trainc.runtime import ExpandedBackwards, wait_for_background_compiles
    finished = []

    class Pending:
        submitted = 1

        def finish(self):
            finished.append(threading.current_thread() is not threading.main_thread())

    graph = CompiledGraph(_FirstRun(lambda args: args, Pending()))
    variants = ExpandedBackwards(lambda strides: graph, background=True)
    tangent = torch.ones(()).expand(4, 3)
    assert variants.get([tangent]) is None  # compiling
    wait_for_background_compiles()
    assert variants.get([tangent]) is graph and finished == [True]
    graph.run([])
    assert finished == [True]  # not again at the first call


def test_compile_and_compile_step_prestart_for_a_cuda_module(monkeypatch):
    """trainc.compile and compile_step start the workers for a module whose parameters are on
    CUDA (codegen.prestart_for), not for CPU modules or functions."""
    import types
    import trainc
    import trainc.codegen as codegen
    seen = []
    monkeypatch.setattr(codegen, "prestart_workers", lambda name, device, config:
                        seen.append(device.type))

    class OnCuda(torch.nn.Module):
        def parameters(self, recurse=True):
            yield types.SimpleNamespace(device=torch.device("cuda"))
    codegen.prestart_for(OnCuda(), Config())
    codegen.prestart_for(torch.nn.Linear(2, 2), Config())
    codegen.prestart_for(lambda x: x, Config())
    assert seen == ["cuda"]
    trainc.compile(torch.nn.Linear(2, 2))
    m = torch.nn.Linear(2, 2)
    trainc.compile_step(m, lambda mod, x: mod(x).sum(), torch.optim.SGD(m.parameters(), 0.1))
    assert seen == ["cuda"]


def test_backward_variants_compile_in_the_foreground_under_a_budget(monkeypatch):
    """Under a memory budget or offload, backward variants compile at their first call: the
    traced backward's dense zero tangents meanwhile would raise the peak above the plan."""
    from trainc import pipeline
    from trainc.config import make_config
    monkeypatch.setattr(pipeline, "compiles_natively_on_cuda", lambda name, device: True)
    cuda = torch.device("cuda")
    assert pipeline.variants_in_background(make_config("triton"), cuda)
    assert not pipeline.variants_in_background(make_config("triton", memory_budget=0.5), cuda)
    assert not pipeline.variants_in_background(make_config("triton", offload=True), cuda)
    assert not pipeline.variants_in_background(
        make_config("triton", background_compile=False), cuda)
