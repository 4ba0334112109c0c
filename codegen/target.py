"""What a backend can do, as data: the drivers (trainc/pipeline.py, trainc/config.py's
`resolve`, codegen/driver.py) ask a backend's `target` these questions, never its name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Union


class Target(Protocol):
    """A backend's capabilities (each backend's `target` attribute)."""
    vector_lanes: tuple[int, ...]  # SIMD lane widths its kernels vectorize to; () : none
    tiles: bool  # transposed stores go through tiles
    channels_last: Union[bool, str]  # Config.conv_channels_last's default on it
    accumulates_grads: bool  # can compile a backward adding into .grad (trainc/accumulate.py)
    cuda_graphs: bool  # compile_step replays its graphs as CUDA graphs by default (on CUDA)
    partition_objective: str  # the min-cut objective for graphs without convolutions/pooling
    compile_workers: bool  # natively on CUDA, kernels compile in worker processes
    offloads: bool  # can move saved activations to host memory and back (codegen/memory/offload.py)


@dataclass(frozen=True)
class ReferenceTarget:
    """backend="aten": ATen runs the graph, nothing is generated."""
    vector_lanes: tuple[int, ...] = ()
    tiles: bool = False
    channels_last: Union[bool, str] = False
    accumulates_grads: bool = False
    cuda_graphs: bool = False  # only when asked (cudagraphs=True wraps any backend)
    partition_objective: str = "bytes"
    compile_workers: bool = False
    offloads: bool = False


ATEN = ReferenceTarget()
