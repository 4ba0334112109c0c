"""The Triton backend's capabilities (codegen/target.py Target)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class TritonCapabilities:
    vector_lanes: tuple[int, ...] = ()  # blocks of a program, not SIMD lanes
    tiles: bool = True  # transposing pointwise kernels as 2-D tiles (triton/transpose.py)
    # channels-last where cuDNN would run NHWC anyway (Config.conv_channels_last)
    channels_last: Union[bool, str] = "eager_tf32"
    accumulates_grads: bool = False
    cuda_graphs: bool = True
    partition_objective: str = "bytes"  # recompute is cheap on GPUs
    compile_workers: bool = True


TRITON = TritonCapabilities()
