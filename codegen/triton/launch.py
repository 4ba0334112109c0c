"""Generated Triton module -> launchers: grid and block sizes per kernel, autotuned on first call
among the configs its plan lists (configs.py); split kernels (split.py) launch their stages in order with per-call scratch buffers.

Tuning results live on disk keyed by (kernel source hash, device name); TRITON_INTERPRET and CPU
tensors, or `triton_autotune=False`, use the heuristic config and never tune.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import threading
import time
from dataclasses import asdict
from typing import Callable, Iterator, Optional

import torch

from trainc.codegen.triton.compile_pool import lead_ready
from trainc.codegen.triton.configs import LaunchConfig
from trainc.codegen.triton.precompile import Precompile, precompile  # noqa: F401
from trainc.codegen.triton.printer import KernelSource
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
            configs = list(self.ks.configs) if self._tunes() else [self.ks.configs[0]]
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
            return self.ks.configs[0]
        device = torch.cuda.get_device_name()
        path = os.path.join(cache_dir(self.config), f"tune_{self.key}.json")
        found = _read(path).get(device)
        if found is not None:
            return LaunchConfig(**found)
        cands = self.ks.configs  # the plan's (codegen/triton/configs.py)
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
