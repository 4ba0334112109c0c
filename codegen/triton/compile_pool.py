"""Fill Triton's on-disk cache in worker processes before a graph's first launch. The front end
of Triton's compiler is Python and holds the GIL, so threads compile little faster than one
(BENCHMARKS.md); the in-process compiles that follow find every kernel on disk.

Workers run the script compile_worker.py, not multiprocessing (a spawned multiprocessing worker
imports the user's main script again) and not this package (its imports cost seconds).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import signal
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
    """`n` compile workers (compile_worker.py: one process imports Triton, then forks them),
    each reading job specs (JSON lines) from a pipe and answering "ok" or "failed" per job, in
    order, on another; a CUDA lead first sends its target. Started before tracing (`workers`);
    one set serves a graph's forward and backward. `submit` returns at once (a thread per
    worker reads its answers), so the lead generates the next graph meanwhile."""

    def __init__(self, n: int):
        _exiting[:] = [p for p in _exiting if p.poll() is None]
        self.proc, self.ins, self.outs, self._next = None, [], [], 0
        pipes = [(os.pipe(), os.pipe()) for _ in range(n)] if n > 0 else []
        theirs = [(jobs[0], answers[1]) for jobs, answers in pipes]
        try:
            self.proc = subprocess.Popen(
                [sys.executable, WORKER, *(f"{r},{w}" for r, w in theirs)],
                pass_fds=[fd for pair in theirs for fd in pair], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:  # no more processes: no workers (all in process)
            for jobs, answers in pipes:
                os.close(jobs[1])
                os.close(answers[0])
            pipes = []
        for fd in (fd for pair in theirs for fd in pair):
            os.close(fd)
        self.ins = [open(jobs[1], "w") for jobs, _ in pipes]
        self.outs = [open(answers[0]) for _, answers in pipes]
        target = _lead_target()
        if target is not None:  # the workers compile for it without touching CUDA
            _prepare_lead()
            line = json.dumps({"target": target, "ptxas_version": _hashed_ptxas_version(target)})
            for f in self.ins:
                f.write(line + "\n")
                f.flush()
        self._waiting = [collections.deque() for _ in self.ins]  # futures in answer order
        self._locks = [threading.Lock() for _ in self.ins]
        self._ended = [False] * len(self.ins)  # its reader saw end of output
        self.errors: list[str] = []  # the first failures workers reported (for debugging)
        for k in range(len(self.ins)):
            threading.Thread(target=self._read, args=(k,), daemon=True).start()

    def submit(self, specs: list[tuple]) -> list[tuple[int, Future]]:
        """Queue `specs` round robin (continuing where the last batch stopped); per spec, its
        worker's index and a future that becomes True when that worker compiled it."""
        out = []
        for spec in specs:
            k, fut = self._next % max(len(self.ins), 1), Future()
            self._next += 1
            out.append((k, fut))
            if not self.ins:
                fut.set_result(False)
                continue
            with self._locks[k]:
                if self._ended[k]:
                    fut.set_result(False)
                    continue
                self._waiting[k].append(fut)
                try:
                    self.ins[k].write(json.dumps(spec) + "\n")
                    self.ins[k].flush()
                except (OSError, ValueError):  # the worker died: its reader fails its jobs
                    pass
        return out

    def _read(self, k: int) -> None:
        try:
            for line in self.outs[k]:
                with self._locks[k]:
                    fut = self._waiting[k].popleft() if self._waiting[k] else None
                if line != "ok\n" and len(self.errors) < 20:
                    self.errors.append(line.strip())
                if fut is not None:
                    fut.set_result(line == "ok\n")
        except (OSError, ValueError):
            pass
        with self._locks[k]:  # end of output: whatever it still owed failed
            self._ended[k] = True
            while self._waiting[k]:
                self._waiting[k].popleft().set_result(False)

    def wait(self, jobs: list[tuple[int, Future]], timeout: float = 600.0) -> int:
        """How many of `jobs` (from submit) compiled; past `timeout` the workers are killed
        (what they had not compiled compiles in process)."""
        futures.wait([f for _, f in jobs], timeout)
        if not all(f.done() for _, f in jobs):
            self.kill()
            futures.wait([f for _, f in jobs], 60)
        return sum(f.done() and f.result() for _, f in jobs)

    def kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def alive(self) -> bool:
        """Every worker still reads jobs (none died or was killed)."""
        return self.proc is not None and self.proc.poll() is None and not any(self._ended)

    def compile(self, specs: list[tuple], timeout: float = 600.0) -> int:
        """Compile `specs`; how many compiled."""
        return self.wait(self.submit(specs), timeout)

    def close(self) -> None:
        """End each worker's input (it exits); not waited for: reaped by the next set."""
        for f in self.ins:
            try:
                f.close()
            except OSError:
                pass
        if self.proc is not None:
            _exiting.append(self.proc)


def _lead_target() -> Optional[list]:
    """This CUDA process's Triton target as [backend, arch, warp_size], as Triton's CUDA driver
    computes it (capability major * 10 + minor, warps of 32), or None (not CUDA, or CUDA not
    initialized here): the workers then import torch and ask Triton's driver themselves."""
    if torch.version.hip is not None or not torch.cuda.is_available() or \
            not torch.cuda.is_initialized():
        return None
    major, minor = torch.cuda.get_device_capability()
    return ["cuda", major * 10 + minor, 32]


def _hashed_ptxas_version(target: list) -> Optional[str]:
    """The ptxas version this process's Triton puts in its cache keys, or None. Triton caches
    it at its first compile, so it can name another ptxas than the one TRITON_PTXAS_PATH now
    points to (torch.compile sets that variable after its first hash): workers hash with the
    lead's string, or the lead would miss every entry they wrote and compile it all again."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version
        return get_ptxas_version(target[1])
    except Exception:  # noqa: BLE001 (no ptxas here: workers then use their own)
        return None


_lead_prep: Optional[threading.Thread] = None


def _prepare_lead() -> None:
    """Start Triton's one-time work in this (the lead) process while the graph is traced:
    building its CUDA driver (its first use compiles and loads Triton's C utilities: gcc, with
    a cold cache; the workers do not need them) and the hash of Triton's own files that leads
    every cache key (`triton_key`: ~0.3 s, reading and hashing libtriton). Both mostly wait on
    gcc, the disk or hashlib, which release the GIL, so they run beside the trace."""
    global _lead_prep
    with _lock:
        if _lead_prep is not None:
            return
        _lead_prep = threading.Thread(target=_prepare_triton, daemon=True)
        _lead_prep.start()


def _prepare_triton() -> None:
    try:
        from triton.runtime import driver
        driver.active.get_current_device()
    except Exception:  # noqa: BLE001 (then the first launch loads it and reports errors)
        pass
    try:
        from triton.runtime.cache import triton_key
        triton_key()
    except Exception:  # noqa: BLE001 (another Triton: its first compile computes its keys)
        pass


def lead_ready() -> None:
    """Wait for _prepare_lead's thread (callers then use Triton's driver in this thread only:
    two threads creating it at once would build it twice)."""
    if _lead_prep is not None:
        _lead_prep.join()


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_worker.py")
_exiting: list = []  # closed workers still shutting down
_active: Optional[Workers] = None  # the workers of the graph being compiled
_idle: Optional[Workers] = None  # the last graph's workers, kept for the next graph a while
_idle_timer: Optional[threading.Timer] = None
_lock = threading.Lock()
KEEP_IDLE_SECONDS = 30.0  # the graphs of one model (graph breaks) compile within seconds


@contextlib.contextmanager
def workers(n: int) -> Iterator[None]:
    """Keep `n` workers for the compiles inside the block (nested blocks share them). The
    workers of the last block stay for KEEP_IDLE_SECONDS and serve the next block that wants
    no more of them: each new set costs seconds of imports before its first compile."""
    global _active
    if n <= 1 or _active is not None:
        yield
        return
    _active = _reuse(n) or Workers(n)
    try:
        yield
    finally:
        _keep_idle(_active)
        _active = None


def prestart(n: int) -> None:
    """Start `n` workers now, kept idle for the first graph (trainc.compile of a CUDA model: its
    first call spends ~0.3 s in Dynamo before the backend runs, while the workers import Triton
    and hash its files), unless a set at least that large is already kept."""
    if n <= 1 or _active is not None or (_idle is not None and len(_idle.ins) >= n and
                                         _idle.alive()):
        return
    _keep_idle(Workers(n))


def _reuse(n: int) -> Optional[Workers]:
    global _idle
    with _lock:
        pool, _idle = _idle, None
        if _idle_timer is not None:
            _idle_timer.cancel()
    if pool is not None and len(pool.ins) >= n and pool.alive():
        return pool
    if pool is not None:
        pool.close()
    return None


def _keep_idle(pool: Workers) -> None:
    global _idle, _idle_timer
    with _lock:
        old, _idle = _idle, pool
        _idle_timer = threading.Timer(KEEP_IDLE_SECONDS, _close_idle, args=(pool,))
        _idle_timer.daemon = True
        _idle_timer.start()
    if old is not None:
        old.close()


def shutdown() -> None:
    """Close the idle workers now (they finish what they have queued, then exit)."""
    if _idle is not None:
        _close_idle(_idle)


def _close_idle(pool: Workers) -> None:
    """End an idle set (its workers finish what they have queued, then exit)."""
    global _idle
    with _lock:
        if _idle is not pool:
            return
        _idle = None
    pool.close()


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
    """Queue `specs` (job_spec tuples) in the active workers, or else the idle ones (kept
    KEEP_IDLE_SECONDS), or else in up to `workers` new processes (closed after the batch).
    Best effort: a failed or missing worker leaves its kernels to the in-process compile."""
    if len(specs) <= 1:
        return Batch(None, [], False)
    if _active is not None:
        return Batch(_active, _active.submit(specs), False)
    idle = _idle  # the last graph's workers, idle: a graph compiled later (a backward for
    if idle is not None and idle.alive():  # tangents of other strides, at its first call)
        return Batch(idle, idle.submit(specs), False)
    if workers <= 1:
        return Batch(None, [], False)
    pool = Workers(min(workers, len(specs)))
    return Batch(pool, pool.submit(specs), True)


def warm_disk_cache(specs: list[tuple], workers: int, timeout: float = 600.0) -> int:
    """start_warm, waited for: how many of `specs` compiled."""
    return start_warm(specs, workers).wait(timeout)
