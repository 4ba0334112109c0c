"""A graph's kernels compiled ahead of their first launch: every launch config a launcher may
run (Launcher.warmups) goes to the compile workers (compile_pool.py) and, at `finish()`, to
threads of the lead; failures are left to the first launch."""
from __future__ import annotations

import functools
import inspect
import os
from typing import Optional

from trainc.codegen.triton.compile_pool import Batch, job_spec, lead_ready, start_warm

JOBS_PER_PROCESS = 4


class Precompile:
    """The compiles `precompile` started for a graph's kernels. `finish()`, called before the
    graph's first launch, waits for the workers' share, then compiles in threads (Triton's
    AsyncCompileMode when present): those load the workers' kernels from the disk cache and
    compile what a worker did not. Failures are ignored: that kernel compiles at its first
    launch, as without this."""

    def __init__(self, jobs: list, batch: Optional[Batch], threads: int):
        self.jobs, self.batch, self.threads = jobs, batch, threads
        self.submitted = len(jobs)

    def finish(self) -> None:
        lead_ready()
        jobs, self.jobs = self.jobs, []
        if self.batch is not None:
            self.batch.wait()
            self.batch = None
        if not jobs:
            return
        try:
            from triton.runtime._async_compile import AsyncCompileMode
            # older versions leave a failed compile's placeholder in the JIT cache: threads
            if "ignore_errors" not in inspect.signature(AsyncCompileMode).parameters:
                AsyncCompileMode = None
        except ImportError:
            AsyncCompileMode = None
        from concurrent.futures import ThreadPoolExecutor
        try:
            with ThreadPoolExecutor(min(self.threads, len(jobs))) as pool:
                if AsyncCompileMode is not None:
                    with AsyncCompileMode(pool, ignore_errors=True):
                        for job in jobs:
                            job()
                else:
                    list(pool.map(_quiet, jobs))
        except Exception:  # noqa: BLE001 (best effort: launches compile what is missing)
            pass


def precompile(launchers: list, workers: int) -> Precompile:
    """Start compiling every kernel's launch configs concurrently (first-call latency: a graph
    has tens of kernels, each compiled serially at its first launch): in worker processes
    into Triton's disk cache (compile_pool.py), then, at `finish()`, in threads. Returns at
    once when workers are running, so the next graph is generated meanwhile."""
    jobs, seen = [], set()
    for launcher in launchers:  # kernels that alias one function (equal layers) compile once
        for j in launcher.warmups():
            key = _job_key(j)
            if key not in seen:
                seen.add(key)
                jobs.append(j)
    if workers <= 1 or len(jobs) <= 1:
        return Precompile([], None, 0)
    specs = [s for s in map(job_spec, jobs) if s is not None]
    # the workers started for this graph (compile_pool.workers, before tracing) take any two
    # or more (the lead's threads compile one at a time: H200 normact, 4 jobs a graph, 2.3 s);
    # new processes, which cost a start and a first compile, from JOBS_PER_PROCESS jobs each
    batch = start_warm(specs, min(workers, os.cpu_count() or 1, len(specs) // JOBS_PER_PROCESS))
    return Precompile(jobs, batch, workers)


def _job_key(job) -> tuple:
    """What a warmup job compiles: its JIT function, argument dtypes and meta-parameters."""
    if not isinstance(job, functools.partial):
        return (id(job),)
    fn = getattr(job.func, "__self__", job.func)
    return (id(fn), job.args, tuple(sorted(job.keywords.items())))


def _quiet(job) -> None:
    try:
        job()
    except Exception:  # noqa: BLE001
        pass
