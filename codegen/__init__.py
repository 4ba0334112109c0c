"""Backends: an FX graph of core ATen ops -> a callable `list of tensors -> list of tensors`.

`backend="aten"` runs the graph node by node with ATen kernels (the reference backend);
generated-code backends (cpp, triton) register here under their names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Protocol, Sequence

import torch
import torch.fx as fx

from trainc.codegen.target import ATEN, Target

if TYPE_CHECKING:
    from trainc.config import Config


@dataclass(frozen=True)
class KernelInfo:
    name: str
    nodes: tuple[str, ...]  # the graph nodes the kernel computes
    bytes_read: int = 0
    bytes_written: int = 0


@dataclass(frozen=True)
class CompiledGraph:
    run: Callable[[list], list]
    kernels: tuple[KernelInfo, ...] = ()
    fallback_ops: tuple[str, ...] = ()  # ATen ops run without generated code (externs excluded)
    source: str = ""  # the wrapper's source, for debug dumps
    extra: dict = field(default_factory=dict)


class Backend(Protocol):
    name: str  # for records and messages; what it can do is its target's (codegen/target.py)
    target: Target

    def compile(self, gm: fx.GraphModule, example_inputs: Sequence) -> CompiledGraph: ...


class AtenBackend:
    """Runs graphs op by op through ATen: always correct, never fast, the oracle for codegen."""
    name = "aten"
    target = ATEN

    def __init__(self, config: Optional["Config"] = None):
        self.config = config

    def compile(self, gm: fx.GraphModule, example_inputs: Sequence) -> CompiledGraph:
        ops = sorted({str(n.target) for n in gm.graph.nodes
                      if isinstance(n.target, torch._ops.OpOverload) and not is_extern(n.target)})

        def run(args: list) -> list:
            return list(gm(*args))

        return CompiledGraph(run, (), tuple(ops), gm.code)


def is_extern(op: torch._ops.OpOverload) -> bool:
    """Ops served by library kernels (mm, conv, attention): never counted as fallbacks."""
    from trainc.decomps import EXTERN_OPS
    return op.overloadpacket in EXTERN_OPS


def _cpp_backend(config: Optional["Config"]) -> Backend:
    from trainc.codegen.cpp import CppBackend  # imports lowerings: only when asked for
    return CppBackend(config)


def _triton_backend(config: Optional["Config"]) -> Backend:
    from trainc.codegen.triton import TritonBackend
    return TritonBackend(config)


BACKENDS: dict[str, Callable[[Optional["Config"]], Backend]] = {
    "aten": AtenBackend, "cpp": _cpp_backend, "triton": _triton_backend}


def backend_name(name: str, device: torch.device) -> str:
    """Resolve "auto": cpp on CPU, triton on CUDA."""
    if name == "auto":
        preferred = "triton" if device.type == "cuda" else "cpp"
        name = preferred if preferred in BACKENDS else "aten"
    return name


def target_for(name: str, device: torch.device) -> Target:
    """The capabilities of backend `name` ("auto" resolved for `device`), without making it."""
    name = backend_name(name, device)
    if name == "cpp":
        from trainc.codegen.cpp.plan import CPU
        return CPU
    if name == "triton":
        from trainc.codegen.triton.plan import GPU
        return GPU
    return ATEN


def get_backend(name: str, device: torch.device, config: Optional["Config"] = None) -> Backend:
    name = backend_name(name, device)
    if name not in BACKENDS:
        raise NotImplementedError(f"trainc: backend {name!r} is not implemented yet; "
                                  f"available: {sorted(BACKENDS)}")
    backend = BACKENDS[name](config)
    if config is not None and getattr(config, "cudagraphs", False):
        if device.type != "cuda":
            from trainc.joint import UnsupportedError
            raise UnsupportedError(
                f"trainc: cudagraphs=True replays CUDA graphs and needs CUDA tensors; this graph "
                f"runs on {device.type} (backend {name!r}): drop the option on this device")
        backend = _CudaGraphs(backend, auto=config.cudagraphs == "auto")
    return backend


def memory_planner(backend: Backend) -> Optional[Callable[[fx.GraphModule, Sequence], object]]:
    """(graph, example inputs) -> the MemoryPlan its wrapper would have, for a code-generating
    backend (codegen/driver.py memory_plan_only); None for ATen (no wrapper, no plan)."""
    inner = getattr(backend, "inner", backend)
    if not hasattr(inner, "lower"):
        return None
    from trainc.codegen.driver import memory_plan_only
    return lambda gm, example_inputs: memory_plan_only(inner, gm, example_inputs)


def memory_models(backend: Backend) -> Optional[Callable]:
    """(graph, example inputs) -> an offload request -> its MemoryPlan (driver.memory_model);
    None for ATen."""
    inner = getattr(backend, "inner", backend)
    if not hasattr(inner, "lower"):
        return None
    from trainc.codegen.driver import memory_model
    return lambda gm, example_inputs: memory_model(inner, gm, example_inputs)


def compiles_natively_on_cuda(name: str, device: torch.device) -> bool:
    """Triton on CUDA, not under the interpreter: where kernels compile in worker processes
    (codegen/triton/compile_pool) and a compile can run beside the GPU's work."""
    if device.type != "cuda" or not target_for(name, device).compile_workers:
        return False
    from trainc.codegen.triton import interpreting
    return not interpreting()


def _max_workers(config: "Config") -> int:
    import os
    return min(config.triton_compile_workers, os.cpu_count() or 1)


def compile_workers(name: str, device: torch.device, config: "Config", size: int):
    """A context for one graph's compile: on CUDA with Triton, its compile worker processes
    start here, so they start while the graph is traced (codegen/triton/compile_pool); one per
    node of `size` (the captured graph's nodes), up to triton_compile_workers. A worker is
    ready soon after its start (it imports Triton only) and each node makes kernels in both
    graphs, most with two or three launch configs to compile (fewer workers queued them;
    BENCHMARKS.md)."""
    import contextlib
    if not compiles_natively_on_cuda(name, device):
        return contextlib.nullcontext()
    from trainc.codegen.triton.compile_pool import workers
    return workers(min(_max_workers(config), size))


def prestart_for(model_or_fn, config: "Config") -> None:
    """trainc.compile / compile_step of a module with CUDA parameters: its Triton compile
    workers start now, beside Dynamo's work before the first graph reaches the backend."""
    params = model_or_fn.parameters() if isinstance(model_or_fn, torch.nn.Module) else ()
    first = next(iter(params), None)
    if first is not None and first.device.type == "cuda":
        prestart_workers(config.backend, first.device, config)


def prestart_workers(name: str, device: torch.device, config: "Config") -> None:
    """Triton on CUDA: start the first graph's compile workers (as many as compile_workers
    may ask for) and the lead's Triton preparation now."""
    if compiles_natively_on_cuda(name, device):
        from trainc.codegen.triton.compile_pool import prestart
        prestart(_max_workers(config))


class _CudaGraphs:
    """Any backend, its compiled graphs replayed as CUDA graphs."""

    def __init__(self, inner: Backend, auto: bool = False):
        self.inner, self.name, self.auto = inner, inner.name, auto
        self.target = inner.target

    def compile(self, gm: fx.GraphModule, example_inputs: Sequence) -> CompiledGraph:
        from trainc.codegen.cudagraphs import with_cudagraphs
        return with_cudagraphs(self.inner.compile(gm, example_inputs), gm, self.auto)
