"""FX graph -> CompiledGraph for the code-generating backends (cpp, triton), one line per stage:
lower -> schedule -> plan kernels -> build -> plan memory and print the wrapper.

What differs between backends sits behind `Generator`: how a graph lowers, the scheduler's
options, kernel plans and their printer, how the kernels' module is built and loaded, and the
wrapper's options. The driver asks the backend's target (codegen/target.py), never its name.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence

import torch
import torch.fx as fx

from trainc.codegen import CompiledGraph
from trainc.codegen.graph import CallNode, LoweredGraph
from trainc.codegen.memory import MemoryPlan, plan_memory
from trainc.codegen.memory.inplace import plan_storage
from trainc.codegen.memory.offload import OFFLOAD, OffloadRequest, plan_offload
from trainc.codegen.names import name_kernels
from trainc.codegen.scheduler import Kernel, Schedule, schedule
from trainc.codegen.target import Target
from trainc.codegen.wrapper import write_wrapper


@dataclass
class Built:
    """A graph's kernels, built: what the wrapper calls (`funcs`: kernel name -> callable),
    each kernel's parameter buffers, the module's listing for the dumped source, the backend's
    extra facts and how to rebuild `run` from plain data (the artifact cache's recipe)."""
    funcs: Any
    params: dict[str, list[str]]
    listing: str
    extra: dict = field(default_factory=dict)
    recipe: Callable[[Any], tuple] = lambda wrapper: ()  # wrapper -> the recipe's data
    finish: Callable[[Callable], Callable] = lambda run: run  # wraps the wrapper's run


class Generator(Protocol):
    """A code-generating backend, as the driver sees it."""
    name: str
    target: Target
    schedule_options: dict  # codegen/scheduler.py schedule()'s keyword arguments

    def device(self, gm: fx.GraphModule, example_inputs: Sequence) -> torch.device: ...

    def lower(self, gm: fx.GraphModule) -> LoweredGraph: ...

    def foreign(self, sched: Schedule, example_inputs: Sequence,
                device: torch.device) -> frozenset: ...

    def plan_kernel(self, kernel: Kernel, g: LoweredGraph) -> Any: ...

    def print_kernel(self, kernel: Kernel, plan: Any, g: LoweredGraph) -> Any: ...

    def build(self, kernels: list, sources: list, sched: Schedule,
              device: torch.device) -> Built: ...

    def wrapper_options(self, sched: Schedule, foreign: frozenset,
                        device: torch.device) -> dict: ...


def generate(backend: Generator, gm: fx.GraphModule, example_inputs: Sequence,
             debug: bool = False) -> CompiledGraph:
    """`debug`: also keep the lowered graph's and the schedule's text (40_/41_ dumps)."""
    t0 = time.perf_counter()
    device = backend.device(gm, example_inputs)
    lowered = backend.lower(gm)
    dumps = {"lowered": str(lowered)} if debug else {}
    sched = name_kernels(schedule(lowered, **backend.schedule_options))
    foreign = backend.foreign(sched, example_inputs, device)
    plan_storage(sched, foreign)  # in-place results into the buffers they overwrite
    if debug:
        dumps["schedule"] = str(sched)
    kernels = [k for k in sched.items if isinstance(k, Kernel)]
    plans = [backend.plan_kernel(k, sched.graph) for k in kernels]
    sources = [backend.print_kernel(k, p, sched.graph) for k, p in zip(kernels, plans)]
    built = backend.build(kernels, sources, sched, device)
    offload = plan_offload(gm.meta.get(OFFLOAD), sched, built.params)
    wrapper = write_wrapper(sched, built.params, offload=offload,
                            **backend.wrapper_options(sched, foreign, device))
    return CompiledGraph(built.finish(wrapper.build(built.funcs)), tuple(k.info for k in kernels),
                         fallback_ops(sched), wrapper.source + built.listing,
                         {**built.extra, "seconds": time.perf_counter() - t0, **wrapper.stats,
                          **_plan_text(backend.target, plans), **dumps,
                          "offloaded_outputs": wrapper.stats["memory_plan"].moved,
                          "offloaded_nodes": wrapper.stats["memory_plan"].moved_nodes,
                          # plain data rebuild() turns back into `run` (artifact cache)
                          "recipe": (backend.name, built.recipe(wrapper))})


def memory_plan_only(backend: Generator, gm: fx.GraphModule,
                     example_inputs: Sequence) -> MemoryPlan:
    """The MemoryPlan `generate` would give the wrapper, without building kernels or printing
    the wrapper: what a memory budget's search predicts a candidate partition's peak from
    (kernels are planned and printed only for the buffers each one takes)."""
    return memory_model(backend, gm, example_inputs)(gm.meta.get(OFFLOAD))


def memory_model(backend: Generator, gm: fx.GraphModule,
                 example_inputs: Sequence) -> Callable[[Optional[OffloadRequest]], MemoryPlan]:
    """An offload request -> the MemoryPlan of `gm`'s wrapper with it: lowered and scheduled
    once, each request only walked again (a budget's search tries several)."""
    device = backend.device(gm, example_inputs)
    sched = name_kernels(schedule(backend.lower(gm), **backend.schedule_options))
    foreign = backend.foreign(sched, example_inputs, device)
    plan_storage(sched, foreign)
    kernels = [k for k in sched.items if isinstance(k, Kernel)]
    params = {k.name: list(backend.print_kernel(k, backend.plan_kernel(k, sched.graph),
                                                sched.graph).params) for k in kernels}
    o = backend.wrapper_options(sched, foreign, device)
    return lambda req: plan_memory(sched, params, keep=o.get("keep", False),
                                   tensors=o.get("tensors", False), gemm=o.get("gemm"),
                                   offload=plan_offload(req, sched, params))


def fallback_ops(sched: Schedule) -> tuple[str, ...]:
    """ATen ops the wrapper runs without generated code (externs such as mm excluded)."""
    return tuple(sorted({str(c.target) for c in sched.items
                         if isinstance(c, CallNode) and c.kind == "fallback"}))


def _plan_text(target: Target, plans: list) -> dict:
    """42_kernels.txt's text, where the backend's plans print themselves."""
    if not plans or not all(hasattr(type(p), "__str__") and type(p).__str__ is not object.__str__
                            for p in plans):
        return {}
    return {"kernel_plans": "\n\n".join([str(target), *map(str, plans)])}


def no_foreign(sched: Schedule, example_inputs: Sequence, device: Optional[torch.device]):
    return frozenset()
