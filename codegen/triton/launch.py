"""Generated Triton module -> launchers: grid and block sizes per kernel, autotuned on first call;
split kernels (split.py) launch their stages in order with per-call scratch buffers.

Tuning results live on disk keyed by (kernel source hash, device name); TRITON_INTERPRET and CPU
tensors, or `triton_autotune=False`, use the heuristic config and never tune.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import inspect
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Optional

import torch

from trainc.codegen.triton.compile_pool import Batch, job_spec, lead_ready, start_warm
from trainc.codegen.triton.printer import KernelSource, next_pow2
from trainc import cache_store
from trainc.config import Config

_modules: dict[str, object] = {}
_lock = threading.Lock()
_timing: Optional[dict] = None  # inside profile_kernels(): Launcher -> [(start, end), ...]


@contextlib.contextmanager
def profile_kernels() -> Iterator[dict]:
    """Time every kernel launch in the block (CUDA events on GPU, wall clock otherwise); on
    exit the yielded dict maps each Launcher (its `.info`: KernelInfo) to a list of ms."""
    global _timing
    out: dict = {}
    _timing = {}
    try:
        yield out
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        for launcher, pairs in _timing.items():
            out[launcher] = [e - s if isinstance(s, float) else s.elapsed_time(e)
                             for s, e in pairs]
        _timing = None


@dataclass(frozen=True)
class LaunchConfig:
    XBLOCK: int
    RBLOCK: int = 0  # looped reductions only
    num_warps: int = 4
    num_stages: int = 1


def cache_dir(config: Config) -> str:
    """The cache's triton/ (trainc/cache_store.py checks who can write it), or a private one."""
    return cache_store.scratch_dir(config, "triton")


def load_module(source: str, config: Config):
    """Import generated source from a file (triton.jit reads functions' source text)."""
    key = hashlib.sha256(source.encode()).hexdigest()[:24]
    path = os.path.join(cache_dir(config), f"k_{key}.py")
    with _lock:
        if path in _modules:
            return _modules[path], path
        if not _holds(path, source):  # missing, truncated or changed: written again
            cache_store.write_atomic(path, source.encode())
        spec = importlib.util.spec_from_file_location(f"trainc_triton_{key}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _modules[path] = mod
        return mod, path


def _holds(path: str, source: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read() == source.encode()
    except OSError:
        return False


def _scratch(ks: KernelSource, args) -> tuple:
    """The kernel's per-call scratch buffers (on CUDA every argument is on the GPU by now)."""
    return tuple(torch.empty(s.numel, dtype=s.dtype, device=args[0].device) for s in ks.scratch)


def heuristic(ks: KernelSource) -> LaunchConfig:
    """The untuned config (and the first candidate). Looped and column configs are the ones
    that won most often when every candidate was timed on the H200 (BENCHMARKS.md, session 9)."""
    if ks.mode == "split":
        return LaunchConfig(1, 2048, 8)
    if ks.mode in ("1d", "scatter"):
        x = min(1024, next_pow2(max(ks.xnumel, ks.rnumel, 1)))
        return LaunchConfig(max(x, 16), 0, 4 if x <= 1024 else 8)
    if ks.rblock:
        x = max(1, min(next_pow2(ks.xnumel), 2048 // ks.rblock))
        return LaunchConfig(x, 0, 4 if x * ks.rblock <= 2048 else 8)
    if ks.column:  # loads run along x: wide x, short r (coalesced, few registers)
        x, r = min(64, next_pow2(ks.xnumel)), min(64, next_pow2(ks.rnumel))
        return LaunchConfig(x, r, 8 if x * r >= 4096 else 4, 2)
    r = min(512, next_pow2(ks.rnumel))  # a few rows per program, pipelined loads
    x = max(1, min(next_pow2(ks.xnumel), 2048 // r))
    return LaunchConfig(x, r, 8 if x * r >= 2048 else 4, 2)


def candidates(ks: KernelSource) -> list[LaunchConfig]:
    """Launch configs worth timing (each one is a Triton compile on first use): the heuristic
    and the runner-up of each kernel class. Timing every config of a wider set on the shared
    models (338 kernels, H200) left the best of these two within 1% of the best of all, in
    total time, at 2 compiles per kernel instead of ~5."""
    h = heuristic(ks)
    if ks.mode == "scatter":
        return [h]
    if ks.mode == "split":
        out = [LaunchConfig(1, 1024, 4), LaunchConfig(1, 4096, 8)]
    elif ks.mode == "1d":
        out = [LaunchConfig(x, 0, 4) for x in (512, 1024) if x <= 2 * next_pow2(ks.xnumel)]
    elif ks.rblock:
        # two 4096-element rows per program: never the H200's pick for normact's rows, and
        # their compile took 2.1-2.4 s against 1.0-1.3 s for one row (session 17)
        xs = [x for x in (1, 2, 4, 8, 16, 32, 64) if 256 <= x * ks.rblock <= 4096
              and x <= next_pow2(ks.xnumel)] or [1]
        out = [LaunchConfig(x, 0, 4) for x in xs[:2]]
    elif ks.column:
        out = [LaunchConfig(min(32, next_pow2(ks.xnumel)), min(64, next_pow2(ks.rnumel)), 4, 2)]
    else:
        out = [LaunchConfig(min(16, next_pow2(ks.xnumel)), min(128, next_pow2(ks.rnumel)), 4, 2)]
    return [h] + [c for c in dict.fromkeys(out) if c != h]


class Launcher:
    """Calls one generated kernel (two for scatters) with tuned grid and meta-parameters."""

    def __init__(self, ks: KernelSource, module, config: Config, interpret: bool,
                 device: Optional[torch.device] = None):
        self.ks, self.config, self.interpret = ks, config, interpret
        self.cuda = device is not None and device.type == "cuda"
        self.fn = getattr(module, ks.name, None)  # split kernels have stage functions only
        self.init = getattr(module, ks.name + "_init", None)
        self.cast = getattr(module, ks.name + "_cast", None)  # float32-accumulated scatters
        self.stages = [(getattr(module, st.fn), st.programs) for st in ks.stages]
        self.cfg: Optional[LaunchConfig] = None
        self.key = hashlib.sha256(ks.source.encode()).hexdigest()[:24]
        self.info = None  # the scheduler's KernelInfo (bytes it must move), set by the backend
        self.dtypes: Optional[tuple] = None  # param dtypes (for precompile), set by the backend
        self._bins: dict = {}  # specialization -> (compiled kernel, constexpr values): _run
        # The last kernel _run launched for a one-kernel launcher: (16-byte alignment of each
        # argument, (launcher, programs, function, metadata, constexpr values)); __call__
        # launches it straight away while the arguments' alignment matches.
        self._fast: Optional[tuple] = None
        self._host_args: Optional[list[int]] = None  # positions of CPU arguments (first call)

    def __call__(self, *args: torch.Tensor) -> None:
        if self.ks.xnumel == 0 and self.ks.mode != "scatter":
            return
        if self.cuda:
            if self._host_args is None:
                self._host_args = [i for i, a in enumerate(args) if not a.is_cuda]
            if self._host_args:  # CPU scalars (the RNG seed) cannot be read by a GPU kernel
                args = tuple(a.to("cuda", non_blocking=True) if not a.is_cuda else a
                             for a in args)
            fast, ctx = self._fast, getattr(_call, "ctx", None)
            if fast is not None and ctx is not None and _timing is None and \
                    [a.data_ptr() % 16 == 0 for a in args] == fast[0]:
                run, programs, function, metadata, consts = fast[1]
                run(programs, 1, 1, ctx[0], function, metadata, None, *ctx[1], *args, *consts)
                return
        if self.cfg is None:
            self.cfg = self._choose(args)
        if _timing is None:
            self._launch(self.cfg, args)
            return
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._launch(self.cfg, args)
            end.record()
        else:
            start = time.perf_counter() * 1e3
            self._launch(self.cfg, args)
            end = time.perf_counter() * 1e3
        _timing.setdefault(self, []).append((start, end))

    def _tunes(self) -> bool:
        """Tuned: autotuning is on and the kernel moves enough bytes for its config to matter
        (a kernel of unknown size is tuned)."""
        moved = (self.info.bytes_read + self.info.bytes_written) if self.info else None
        return self.config.triton_autotune and (
            moved is None or moved >= self.config.triton_tune_min_bytes)

    def warmups(self) -> list:
        """Callables compiling this kernel for the configs its first call may launch (the
        tuned one when cached on disk, else every candidate, or the heuristic untuned)."""
        if not self.cuda or self.dtypes is None:
            return []
        found = _read(os.path.join(cache_dir(self.config), f"tune_{self.key}.json")).get(
            torch.cuda.get_device_name())
        if found is not None:
            configs = [LaunchConfig(**found)]
        else:
            configs = candidates(self.ks) if self._tunes() else [heuristic(self.ks)]
        fns = [f for f, _ in self.stages] or [f for f in (self.init, self.fn, self.cast)
                                              if f is not None]
        dtypes = list(self.dtypes) + [s.dtype for s in self.ks.scratch]
        jobs = []
        for c in configs:
            kw = {"XBLOCK": c.XBLOCK, "num_warps": c.num_warps, "num_stages": c.num_stages}
            if c.RBLOCK or self.ks.mode == "split":
                kw["RBLOCK"] = c.RBLOCK
            jobs += [functools.partial(f.warmup, *dtypes, grid=(1,), **kw) for f in fns]
        return jobs

    def _launch(self, c: LaunchConfig, args) -> None:
        ks = self.ks
        kw = {"XBLOCK": c.XBLOCK, "num_warps": c.num_warps, "num_stages": c.num_stages}
        if ks.mode == "scatter":
            args = tuple(args) + _scratch(ks, args)
            if ks.xnumel:
                self._run(self.init, _cdiv(ks.xnumel, c.XBLOCK), args, kw)
            if ks.rnumel:
                self._run(self.fn, _cdiv(ks.rnumel, c.XBLOCK), args, kw)
            if ks.xnumel and self.cast is not None:
                self._run(self.cast, _cdiv(ks.xnumel, c.XBLOCK), args, kw)
            return
        if c.RBLOCK:
            kw["RBLOCK"] = c.RBLOCK
        if ks.mode == "split":
            args = tuple(args) + _scratch(ks, args)
            for fn, programs in self.stages:
                self._run(fn, programs, args, kw)
            return
        self._run(self.fn, _cdiv(ks.xnumel, c.XBLOCK), args, kw)

    def _run(self, fn, programs: int, args: tuple, kw: dict) -> None:
        """fn[(programs,)](*args, **kw). Through the JIT function, a launch costs tens of
        microseconds of Python (binding, specialization, cache lookup), paid on every kernel of
        every call. With `triton_fast_launch`, the compiled kernel a JIT launch returns is kept
        per specialization (every argument is a tensor of the dtype the graph fixed: its
        16-byte alignment, as Triton specializes it, and the meta-parameters) and later launches
        call its launcher directly, as Inductor does. Launch hooks (profilers) take the JIT
        path."""
        hooks = _launch_hooks() if self.cuda and self.config.triton_fast_launch else None
        if hooks is None:
            fn[(programs,)](*args, **kw)
            return
        drv = _driver()
        device = drv.get_current_device()
        aligned = [a.data_ptr() % 16 == 0 for a in args]
        key = (id(fn), device, *kw.values(), *aligned)
        hit = self._bins.get(key)
        if hit is None:
            kernel = fn[(programs,)](*args, **kw)
            names = getattr(fn, "arg_names", None)
            if (kernel is not None and names is not None and len(names) >= len(args)
                    and all(n in kw for n in names[len(args):])):
                self._bins[key] = (kernel, tuple(kw[n] for n in names[len(args):]))
            return
        kernel, consts = hit
        kernel.run(programs, 1, 1, drv.get_current_stream(device), kernel.function,
                   kernel.packed_metadata, None, *hooks, *args, *consts)
        if self.ks.mode not in ("scatter", "split"):  # one kernel per call: __call__'s path
            self._fast = (aligned, (kernel.run, programs, kernel.function,
                                    kernel.packed_metadata, consts))

    def _choose(self, args) -> LaunchConfig:
        tunable = (self._tunes() and not self.interpret and
                   any(isinstance(a, torch.Tensor) and a.is_cuda for a in args))
        if not tunable:
            return heuristic(self.ks)
        device = torch.cuda.get_device_name()
        path = os.path.join(cache_dir(self.config), f"tune_{self.key}.json")
        found = _read(path).get(device)
        if found is not None:
            return LaunchConfig(**found)
        cands = candidates(self.ks)
        # timing re-runs the kernel: buffers it updates in place are timed on copies
        scratch = tuple(a.clone() if p in self.ks.inplace else a
                        for p, a in zip(self.ks.params, args))
        best = cands[0] if len(cands) == 1 else min(cands, key=lambda c: self._time(c, scratch))
        entries = _read(path)
        entries[device] = asdict(best)
        _write(path, entries)
        return best

    def _time(self, c: LaunchConfig, args) -> float:
        """Median ms of a few launches (on copies of in-place buffers: re-runs are harmless);
        a config that fails to compile is never chosen."""
        try:
            self._launch(c, args)
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 (e.g. out of shared memory for this config)
            return float("inf")
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            for _ in range(3):
                self._launch(c, args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 3)
        return sorted(times)[len(times) // 2]


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


_call = threading.local()  # .ctx: (stream, launch hooks) of the running wrapper call, or None


def begin_call() -> None:
    """Called by a wrapper before its first launch: the current device's stream and Triton's
    launch hooks, looked up once per call instead of once per kernel (~5 us each). None (every
    launch goes through _run's checks) when a hook is installed or nothing runs on CUDA."""
    hooks = _launch_hooks() if torch.cuda.is_initialized() else None
    if hooks is None:
        _call.ctx = None
        return
    drv = _driver()
    _call.ctx = (drv.get_current_stream(drv.get_current_device()), hooks)


def end_call() -> None:
    _call.ctx = None


_HOOKS: Optional[Callable[[], tuple]] = None


def _launch_hooks() -> Optional[tuple]:
    """The launch hooks to pass a kernel's launcher, (None, None), or None when a hook is
    installed (e.g. a profiler: launches then go through the JIT). Triton 3.9 keeps them in
    hook chains (empty: none installed), older versions as a function or None."""
    global _HOOKS
    if _HOOKS is None:
        try:
            from triton import knobs
            rt = knobs.runtime
            _HOOKS = lambda: (rt.launch_enter_hook, rt.launch_exit_hook)
        except ImportError:
            from triton.compiler import CompiledKernel as ck
            _HOOKS = lambda: (getattr(ck, "launch_enter_hook", None),
                              getattr(ck, "launch_exit_hook", None))
    enter, leave = _HOOKS()
    if (enter is not None and getattr(enter, "calls", True)) or (
            leave is not None and getattr(leave, "calls", True)):
        return None
    return None, None  # empty chains: the launcher skips the hooks instead of calling them


@functools.lru_cache(maxsize=None)
def _driver():
    """Triton's active driver (current device and stream, as its JIT launches read them)."""
    lead_ready()
    from triton.runtime import driver
    return driver.active


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _read(path: str) -> dict:
    """Tuning results (checksummed: a bad file is no results, tuned again)."""
    try:
        out = json.loads(cache_store.read_entry(path))
        return out if isinstance(out, dict) else {}
    except (OSError, ValueError, cache_store.CorruptEntry):
        return {}


def _write(path: str, entries: dict) -> None:
    cache_store.write_entry(path, json.dumps(entries).encode())
