"""The Triton backend: FX graph -> lowered IR -> schedule (shared with cpp) -> one generated
Triton module + the shared Python wrapper (kernels take tensors; buffers on the graph's device).
CPU tensors work under TRITON_INTERPRET=1 (tests)."""
from __future__ import annotations

import math
import os
from typing import Optional, Sequence

import torch
import torch.fx as fx

from trainc.codegen import CompiledGraph, is_extern
from trainc.codegen.driver import Built, generate
from trainc.codegen.split_reductions import split_reductions
from trainc.codegen.graph import LoweredGraph, lower
from trainc.codegen.lowerings import LOWERINGS
from trainc.codegen.scheduler import Kernel, Schedule
from trainc.codegen.triton.launch import (Launcher, begin_call, end_call, load_module,
                                          precompile)
from trainc.codegen.triton.plan import KernelPlan, TritonTarget, plan_kernel
from trainc.codegen.triton.prelude import PRELUDE
from trainc.codegen.triton.printer import KernelSource, print_kernel
from trainc.config import Config, make_config
from trainc.graph import graph_device


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def low_precision_conv(node: fx.Node) -> bool:
    """Channels-last for a convolution computing in bfloat16 or float16 (cuDNN runs those in
    NHWC and converts NCHW arguments around each one)."""
    v = node.args[0].meta.get("val")  # the input (forward) or the output's gradient
    return isinstance(v, torch.Tensor) and v.dtype in (torch.bfloat16, torch.float16)


def eager_tf32_conv(node: fx.Node) -> bool:
    """The default `conv_channels_last` rule on triton (also "eager_tf32"): low_precision_conv's
    choice, and channels-last for a float32 convolution that eager runs in TF32 at its shapes
    anyway (tf32_probe.py); other float32 ones stay NCHW (see Config.conv_channels_last)."""
    if low_precision_conv(node):
        return True
    from trainc.codegen.triton.tf32_probe import eager_runs_tf32
    return eager_runs_tf32(node)


class TritonBackend:
    """codegen/driver.py's stages for Triton: one generated module, each kernel a launcher the
    wrapper calls with tensors; on CUDA the kernels start compiling in worker processes."""
    name = "triton"

    def __init__(self, config: Optional[Config] = None):
        self.config = config or make_config()
        # what it can do (codegen/target.py) and what its kernel plans are made for
        self.target = TritonTarget(precise_div=self.config.triton_precise_div)
        self.schedule_options = {"register_row": self.target.persistent_limit}

    def compile(self, gm: fx.GraphModule, example_inputs: Sequence) -> CompiledGraph:
        return generate(self, gm, example_inputs, debug=bool(self.config.debug_dir))

    def device(self, gm: fx.GraphModule, example_inputs: Sequence) -> torch.device:
        device = graph_device(gm, example_inputs)
        if device.type != "cuda" and not interpreting():
            raise RuntimeError("trainc: backend='triton' runs CUDA tensors (or CPU tensors under "
                               "TRITON_INTERPRET=1); use backend='cpp' or 'aten' on CPU")
        return device

    def lower(self, gm: fx.GraphModule) -> LoweredGraph:
        channels_last = self.config.conv_channels_last
        if channels_last is None or channels_last == "eager_tf32":
            channels_last = eager_tf32_conv
        return split_reductions(lower(gm, LOWERINGS, is_extern, channels_last,
                                      store_scalars=True,
                                      aten_nodes=self.config.aten_nodes))

    def foreign(self, sched: Schedule, example_inputs: Sequence,
                device: torch.device) -> frozenset:
        """Inputs no result may take in place: those the launcher only sees as a device copy
        (a CPU scalar such as Adam's step count on CUDA)."""
        return _foreign(sched, example_inputs, device)

    def plan_kernel(self, kernel: Kernel, g: LoweredGraph) -> KernelPlan:
        return plan_kernel(kernel, g, self.target)

    def print_kernel(self, kernel: Kernel, plan: KernelPlan, g: LoweredGraph) -> KernelSource:
        return print_kernel(kernel, plan, g)

    def build(self, kernels: list, sources: list, sched: Schedule, device: torch.device) -> Built:
        module_src = PRELUDE + _module_body(sources)
        launch = tuple((s, k.info, tuple(sched.graph.buffers[b].dtype for b in s.params))
                       for s, k in zip(sources, kernels))
        funcs, path, pending = _launchers(module_src, launch, device, self.config)
        listing = (f"\n\n# Triton kernels ({path or 'none'}):\nTRITON_SOURCE = "
                   f"r'''\n{module_src}'''\n")
        return Built(funcs, {s.name: list(s.params) for s in sources}, listing,
                     {"triton": module_src, "module": path, "device": str(device),
                      "precompiled": pending.submitted if pending else 0},
                     recipe=lambda wrapper: (wrapper, module_src, launch, device),
                     finish=lambda run: _FirstRun(run, pending)
                     if pending and pending.submitted else run)

    def wrapper_options(self, sched: Schedule, foreign: frozenset, device: torch.device) -> dict:
        host = [b for b in sched.graph.inputs if b in foreign and device.type == "cuda"
                and math.prod(sched.graph.buffers[b].shape) == 1]
        return {"tensors": True, "device": device, "host_scalars": host,
                "keep": self.config.triton_keep_buffers and self.config.memory_budget is None}


def _launchers(module_src: str, launch: tuple, device: torch.device, config: Config) -> tuple:
    """(kernel namespace, module path, precompile or None) for the generated module; on CUDA
    the kernels start compiling in the workers now."""
    funcs, path, pending = _Kernels(), "", None
    if launch:
        interpret = interpreting()
        mod, path = load_module(module_src, config)
        for s, info, dtypes in launch:
            launcher = Launcher(s, mod, config, interpret, device)
            launcher.info, launcher.dtypes = info, dtypes
            setattr(funcs, s.name, launcher)
        if device.type == "cuda" and not interpret:
            pending = precompile(list(vars(funcs).values()), config.triton_compile_workers)
    return funcs, path, pending


def rebuild(recipe: tuple, config: Config):
    """A compiled graph's `run` from its recipe (CompiledGraph.extra["recipe"][1]): launchers
    for the stored module, no tracing or codegen (Triton's own cache holds the binaries)."""
    wrapper, module_src, launch, device = recipe
    funcs, _, pending = _launchers(module_src, launch, device, config)
    run = wrapper.build(funcs)
    return _FirstRun(run, pending) if pending and pending.submitted else run


def _module_body(sources: list) -> str:
    """Each distinct kernel once; a kernel equal to an earlier one (the same layer again: its
    functions print equal up to their name) is an alias of it, so Triton compiles (and tunes)
    it once."""
    seen: dict[tuple, str] = {}
    parts = []
    for s in sources:
        first = seen.setdefault(s.funcs, s.name)
        if first == s.name:
            parts.append("\n\n" + s.source + "\n")
            continue
        parts.append("".join(f"\n{s.name}{suffix} = {first}{suffix}" for suffix, _ in s.funcs)
                     + "\n")
    return "".join(parts)


class _FirstRun:
    """A wrapper's run that first finishes its kernels' precompile (launch.Precompile): the
    workers compile while later graphs are generated; the first launch must not compile
    again what they are still compiling."""
    __slots__ = ("run", "pending")

    def __init__(self, run, pending):
        self.run, self.pending = run, pending

    def __call__(self, args: list) -> list:
        self.prepare()
        return self.run(args)

    def prepare(self) -> None:
        """Finish the precompile now (a graph compiled in the background is ready only when
        its kernels are: its first call must not wait for them)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.finish()


class _Kernels:
    """Namespace of kernel launchers, as the wrapper calls them (K.kernel3(buf0, buf1)), and
    the per-call launch context (K.begin() ... K.end())."""
    begin = staticmethod(begin_call)
    end = staticmethod(end_call)


def _foreign(sched, example_inputs: Sequence, device: torch.device) -> frozenset:
    """Input buffers whose example tensor lives on another device than the kernels."""
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    return frozenset(name for name, x in zip(sched.graph.inputs, tensors)
                     if x.device.type != device.type)
