"""Fill Triton's on-disk cache in worker processes before a graph's first launch. The front end
of Triton's compiler is Python and holds the GIL, so threads compile little faster than one
(H200 host, gpt bf16 step, 218 compiles: 36 s in 8 threads, 24 s in 16 processes); the
in-process compiles that follow find every kernel on disk.

Workers run the script compile_worker.py, not multiprocessing (a spawned multiprocessing worker
imports the user's main script again) and not this package (its imports cost seconds).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import subprocess
import sys
import threading
from concurrent import futures
from concurrent.futures import Future
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
    """Worker processes (compile_worker.py) that read job specs (JSON lines) on stdin and answer
    "ok" or "failed" per job, in order, on stdout. Started before tracing (`workers`), they
    import torch and Triton while the lead traces; one set serves a graph's forward and
    backward. `submit` returns at once (a thread per worker reads its answers), so the lead
    generates the next graph while the workers compile the last one's kernels."""

    def __init__(self, n: int):
        _exiting[:] = [p for p in _exiting if p.poll() is None]
        self.procs, self._next = [], 0
        for _ in range(n):
            try:
                self.procs.append(subprocess.Popen(
                    [sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL, text=True))
            except OSError:  # no more processes: fewer workers (none: all in process)
                break
        self._waiting = [collections.deque() for _ in self.procs]  # futures in answer order
        self._locks = [threading.Lock() for _ in self.procs]
        self._ended = [False] * len(self.procs)  # its reader saw end of output
        for k in range(len(self.procs)):
            threading.Thread(target=self._read, args=(k,), daemon=True).start()

    def submit(self, specs: list[tuple]) -> list[tuple[int, Future]]:
        """Queue `specs` round robin (continuing where the last batch stopped); per spec, its
        worker's index and a future that becomes True when that worker compiled it."""
        out = []
        for spec in specs:
            k, fut = self._next % max(len(self.procs), 1), Future()
            self._next += 1
            out.append((k, fut))
            if not self.procs:
                fut.set_result(False)
                continue
            with self._locks[k]:
                if self._ended[k]:
                    fut.set_result(False)
                    continue
                self._waiting[k].append(fut)
                try:
                    self.procs[k].stdin.write(json.dumps(spec) + "\n")
                    self.procs[k].stdin.flush()
                except (OSError, ValueError):  # the worker died: its reader fails its jobs
                    self.procs[k].kill()
        return out

    def _read(self, k: int) -> None:
        p = self.procs[k]
        try:
            for line in p.stdout:
                with self._locks[k]:
                    fut = self._waiting[k].popleft() if self._waiting[k] else None
                if fut is not None:
                    fut.set_result(line == "ok\n")
        except (OSError, ValueError):
            pass
        with self._locks[k]:  # end of output: whatever it still owed failed
            self._ended[k] = True
            while self._waiting[k]:
                self._waiting[k].popleft().set_result(False)

    def wait(self, jobs: list[tuple[int, Future]], timeout: float = 600.0) -> int:
        """How many of `jobs` (from submit) compiled; a worker past `timeout` is killed (its
        kernels compile in process)."""
        futures.wait([f for _, f in jobs], timeout)
        for k in {k for k, f in jobs if not f.done()}:
            self.procs[k].kill()
        return sum(f.done() and f.result() for _, f in jobs)

    def compile(self, specs: list[tuple], timeout: float = 600.0) -> int:
        """Compile `specs`; how many compiled."""
        return self.wait(self.submit(specs), timeout)

    def close(self) -> None:
        """End each worker's input (it exits); not waited for: reaped by the next set."""
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        _exiting.extend(self.procs)


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_worker.py")
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


class Batch:
    """Compiles queued in worker processes; `wait()` says how many succeeded."""

    def __init__(self, pool: Optional[Workers], jobs: list, owned: bool):
        self.pool, self.jobs, self.owned = pool, jobs, owned

    def wait(self, timeout: float = 600.0) -> int:
        if self.pool is None:
            return 0
        try:
            return self.pool.wait(self.jobs, timeout)
        finally:
            if self.owned:
                self.pool.close()
            self.pool = None


def start_warm(specs: list[tuple], workers: int) -> Batch:
    """Queue `specs` (job_spec tuples) in the active workers, or else in up to `workers` new
    processes (closed after the batch). Best effort: a failed or missing worker leaves its
    kernels to the in-process compile."""
    if len(specs) <= 1:
        return Batch(None, [], False)
    if _active is not None:
        return Batch(_active, _active.submit(specs), False)
    if workers <= 1:
        return Batch(None, [], False)
    pool = Workers(min(workers, len(specs)))
    return Batch(pool, pool.submit(specs), True)


def warm_disk_cache(specs: list[tuple], workers: int, timeout: float = 600.0) -> int:
    """start_warm, waited for: how many of `specs` compiled."""
    return start_warm(specs, workers).wait(timeout)
