"""The C++ CPU backend: FX graph -> lowered IR -> fused kernels -> one C++ library + wrapper."""
from __future__ import annotations

import ctypes
import os
from typing import Callable, Optional, Sequence

import torch
import torch.fx as fx

from trainc.codegen import CompiledGraph, is_extern
from trainc.codegen.cpp import gemm
from trainc.codegen.cpp.build import PendingBuild, start_build
from trainc.codegen.cpp.plan import CPU, MIN_INNER, SCRATCH_BYTES, KernelPlan, plan_kernel
from trainc.codegen.cpp.printer import print_kernel
from trainc.codegen.driver import Built, generate, no_foreign
from trainc.codegen.graph import LoweredGraph, lower
from trainc.codegen.lowerings import LOWERINGS
from trainc.codegen.scheduler import Kernel, Schedule
from trainc.config import Config, make_config
from trainc.graph import graph_device

_PRELUDE = open(os.path.join(os.path.dirname(__file__), "prelude.h")).read()


class CppBackend:
    """codegen/driver.py's stages for C++: kernels planned (codegen/cpp/plan.py) and printed into
    one library, built by g++ in the background; the wrapper calls them through ctypes."""
    name = "cpp"
    target = CPU  # what the kernel plans are made for (codegen/cpp/plan.py)
    schedule_options = {"scratch_bytes": SCRATCH_BYTES, "min_inner": MIN_INNER}

    def __init__(self, config: Optional[Config] = None):
        self.config = config or make_config()

    def compile(self, gm: fx.GraphModule, example_inputs: Sequence) -> CompiledGraph:
        return generate(self, gm, example_inputs, debug=bool(self.config.debug_dir))

    def device(self, gm: fx.GraphModule, example_inputs: Sequence) -> torch.device:
        device = graph_device(gm, example_inputs)
        if device.type != "cpu":
            raise RuntimeError(f"trainc: backend='cpp' runs CPU tensors; this graph computes on "
                               f"{device}: use backend='triton' (CUDA) or 'aten'")
        return device

    def lower(self, gm: fx.GraphModule) -> LoweredGraph:
        return lower(gm, LOWERINGS, is_extern, self.config.conv_channels_last is not False,
                     aten_nodes=self.config.aten_nodes)

    foreign = staticmethod(no_foreign)

    def plan_kernel(self, kernel: Kernel, g: LoweredGraph) -> KernelPlan:
        return plan_kernel(kernel, g, self.target)

    print_kernel = staticmethod(print_kernel)

    def build(self, kernels: list, sources: list, sched: Schedule, device) -> Built:
        params = {k.name: list(src.params) for k, src in zip(kernels, sources)}
        cpp = _PRELUDE + "\n\n" + "\n\n".join(src.code for src in sources) + "\n"
        funcs, path, hit = _load_kernels(cpp, params, self.config)
        listing = f"\n\n# C++ kernels ({path or 'none'}):\nCPP_SOURCE = r'''\n" + cpp + "'''\n"
        return Built(funcs, params, listing, {"cpp": cpp, "library": path, "cache_hit": hit},
                     recipe=lambda wrapper: (wrapper, params, cpp))

    def wrapper_options(self, sched: Schedule, foreign, device) -> dict:
        return {"keep": self.config.cpp_keep_buffers and self.config.memory_budget is None,
                "gemm": gemm.chooser(sched.graph, self.config.cpp_gemm)}


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
