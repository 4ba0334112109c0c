"""Fill Triton's on-disk cache in worker processes before a graph's first launch. The front end
of Triton's compiler is Python and holds the GIL, so threads compile little faster than one
(H200 host, gpt bf16 step, 218 compiles: 36 s in 8 threads, 24 s in 16 processes); the
in-process compiles that follow find every kernel on disk.

Workers run `python -m trainc.codegen.triton.compile_pool`, not multiprocessing: a spawned
multiprocessing worker imports the user's main script again.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import threading
import time
from typing import Iterator, Optional

import torch


def job_spec(job) -> Optional[tuple]:
    """A warmup job (functools.partial(jit_fn.warmup, *dtypes, grid=..., **meta)) as what a
    worker needs: (module file, function name, dtype names, meta); None for other callables."""
    fn = getattr(getattr(job, "func", None), "__self__", None)
    code = getattr(getattr(fn, "fn", None), "__code__", None)
    if not isinstance(job, functools.partial) or code is None:
        return None
    if not all(isinstance(a, torch.dtype) for a in job.args):
        return None
    meta = {k: v for k, v in job.keywords.items() if k != "grid"}
    return (code.co_filename, fn.fn.__name__, tuple(str(a).split(".")[-1] for a in job.args),
            meta)


class Workers:
    """Worker processes that read job specs (JSON lines) on stdin and answer "ok" or "failed"
    per job on stdout. Started before tracing (`workers`), they import torch and Triton while
    the lead traces; one set serves a graph's forward and backward."""

    def __init__(self, n: int):
        _exiting[:] = [p for p in _exiting if p.poll() is None]
        self.procs = []
        for _ in range(n):
            try:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "trainc.codegen.triton.compile_pool"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                    text=True))
            except OSError:  # no more processes: fewer workers (none: all in process)
                break

    def compile(self, specs: list[tuple], timeout: float = 600.0) -> int:
        """Compile `specs` round robin; how many compiled. A worker that dies or runs past
        `timeout` is dropped (its kernels compile in process)."""
        procs = [p for p in self.procs if p.poll() is None]
        done = [0] * len(procs)

        def serve(k: int) -> None:
            p, jobs = procs[k], specs[k::len(procs)]
            try:
                p.stdin.write("".join(json.dumps(j) + "\n" for j in jobs))
                p.stdin.flush()
                done[k] = sum(p.stdout.readline() == "ok\n" for _ in jobs)
            except (OSError, ValueError):
                p.kill()

        threads = [threading.Thread(target=serve, args=(k,), daemon=True)
                   for k in range(min(len(procs), len(specs)))]
        deadline = time.monotonic() + timeout
        for t in threads:
            t.start()
        for k, t in enumerate(threads):
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                procs[k].kill()
        return sum(done)

    def close(self) -> None:
        """End each worker's input (it exits); not waited for: reaped by the next set."""
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        _exiting.extend(self.procs)


_exiting: list = []  # closed workers still shutting down
_active: Optional[Workers] = None  # the workers of the graph being compiled


@contextlib.contextmanager
def workers(n: int) -> Iterator[None]:
    """Keep `n` workers for the compiles inside the block (nested blocks share them)."""
    global _active
    if n <= 1 or _active is not None:
        yield
        return
    _active = Workers(n)
    try:
        yield
    finally:
        _active.close()
        _active = None


def warm_disk_cache(specs: list[tuple], workers: int, timeout: float = 600.0) -> int:
    """Compile `specs` (job_spec tuples) in the active workers, or else in up to `workers`
    new processes; returns how many compiled. Best effort: a failed or missing worker leaves
    its kernels to the in-process compile."""
    if len(specs) <= 1:
        return 0
    if _active is not None:
        return _active.compile(specs, timeout)
    if workers <= 1:
        return 0
    pool = Workers(min(workers, len(specs)))
    try:
        return pool.compile(specs, timeout)
    finally:
        pool.close()


def _compile(spec: list, modules: dict) -> None:
    import importlib.util
    path, name, dtypes, meta = spec
    if path not in modules:
        s = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        modules[path] = importlib.util.module_from_spec(s)
        s.loader.exec_module(modules[path])
    kernel = getattr(modules[path], name).warmup(*(getattr(torch, d) for d in dtypes),
                                                 grid=(1,), **meta)
    try:  # also its C launcher (cached on disk per signature, ~0.4 s of gcc each); not
        # _init_handles, which would load the module: a CUDA context per worker
        from triton.runtime import driver
        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 (optional: the first launch builds what is missing)
        pass


def main() -> None:
    modules: dict = {}
    for line in sys.stdin:  # one job per line until the lead closes the pipe
        try:
            _compile(json.loads(line), modules)
            print("ok", flush=True)
        except Exception as e:  # noqa: BLE001 (the in-process compile reports real errors)
            print("failed", type(e).__name__, flush=True)


if __name__ == "__main__":
    main()
