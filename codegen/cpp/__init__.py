"""The C++ CPU backend: FX graph -> lowered IR -> fused kernels -> one C++ library + wrapper."""
from __future__ import annotations

import ctypes
import os
import time
from typing import Callable, Optional, Sequence

import torch.fx as fx

from trainc.codegen import CompiledGraph, is_extern
from trainc.codegen.cpp import gemm
from trainc.codegen.cpp.build import PendingBuild, start_build
from trainc.codegen.cpp.plan import CPU, MIN_INNER, SCRATCH_BYTES, plan_kernel
from trainc.codegen.cpp.printer import print_kernel
from trainc.codegen.graph import CallNode, lower
from trainc.codegen.lowerings import LOWERINGS
from trainc.codegen.scheduler import Kernel, schedule
from trainc.codegen.memory.inplace import plan_storage
from trainc.codegen.wrapper import write_wrapper
from trainc.config import Config, make_config

_PRELUDE = open(os.path.join(os.path.dirname(__file__), "prelude.h")).read()


class CppBackend:
    name = "cpp"
    target = CPU  # what the kernel plans are made for (codegen/cpp/plan.py)

    def __init__(self, config: Optional[Config] = None):
        self.config = config or make_config()

    def compile(self, gm: fx.GraphModule, example_inputs: Sequence) -> CompiledGraph:
        t0 = time.perf_counter()
        channels_last = self.config.conv_channels_last is not False
        sched = schedule(lower(gm, LOWERINGS, is_extern, channels_last,
                               aten_nodes=self.config.aten_nodes),
                         scratch_bytes=SCRATCH_BYTES,
                         min_inner=MIN_INNER)
        plan_storage(sched)  # in-place results into the buffers they overwrite
        kernels = [k for k in sched.items if isinstance(k, Kernel)]
        plans = [plan_kernel(k, sched.graph, self.target) for k in kernels]
        sources, params = [], {}
        for k, plan in zip(kernels, plans):
            src = print_kernel(k, plan, sched.graph)
            sources.append(src.code)
            params[k.name] = list(src.params)
        cpp = _PRELUDE + "\n\n" + "\n\n".join(sources) + "\n"
        funcs, path, hit = _load_kernels(cpp, params, self.config)
        keep = self.config.cpp_keep_buffers and self.config.memory_budget is None
        wrapper = write_wrapper(sched, params, keep=keep,
                                gemm=gemm.chooser(sched.graph, self.config.cpp_gemm))
        fallbacks = sorted({str(c.target) for c in sched.items
                            if isinstance(c, CallNode) and c.kind == "fallback"})
        source = (wrapper.source + f"\n\n# C++ kernels ({path or 'none'}):\nCPP_SOURCE = r'''\n"
                  + cpp + "'''\n")
        return CompiledGraph(wrapper.build(funcs), tuple(k.info for k in kernels),
                             tuple(fallbacks), source,
                             {"cpp": cpp, "library": path, "cache_hit": hit,
                              "seconds": time.perf_counter() - t0, **wrapper.stats,
                              "kernel_plans": "\n\n".join([str(self.target), *map(str, plans)]),
                              # plain data rebuild() turns back into `run` (artifact cache)
                              "recipe": ("cpp", (wrapper, params, cpp))})


class _Kernels:
    """Namespace of the library's kernel functions (ctypes), as the wrapper calls them; filled
    at the first lookup, when the library (maybe still compiling) is first needed."""

    def __init__(self, pending: Optional[PendingBuild], params: dict[str, list[str]]):
        self._pending, self._params = pending, params

    def __getattr__(self, name: str):  # only for names not set yet
        if name.startswith("_") or self._pending is None:
            raise AttributeError(name)
        return getattr(self.load(), name)

    def load(self) -> "_Kernels":
        """Wait for the library and set every kernel function as an attribute."""
        if self._pending is not None:
            lib, self._pending = self._pending.library(), None
            for kname, ps in self._params.items():
                f = getattr(lib, kname)
                f.argtypes = [ctypes.c_void_p] * len(ps)
                f.restype = None
                setattr(self, kname, f)
        return self


def _load_kernels(cpp: str, params: dict[str, list[str]], config: Config):
    """(kernel functions, library path, cache hit) for the C++ source `cpp`; the library is
    built in the background and loaded at the first kernel call."""
    pending = start_build(cpp, config) if params else None
    return _Kernels(pending, params), pending.path if pending else "", \
        pending.hit if pending else True


def rebuild(recipe: tuple, config: Config) -> Callable[[list], list]:
    """A compiled graph's `run` from its recipe (CompiledGraph.extra["recipe"][1])."""
    wrapper, params, cpp = recipe
    return wrapper.build(_load_kernels(cpp, params, config)[0])
