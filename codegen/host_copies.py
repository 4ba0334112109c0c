"""The copies a wrapper with offloaded buffers makes (codegen/memory/offload.py plans them).

On CUDA: to pinned host memory on one side stream, back to the device on another, both per
device and shared by every wrapper, so a backward's first copy back can wait for the forward's
copies to host. The caching allocator holds a device buffer whose copy to host is still running
(record_stream), and the host allocator a pinned buffer whose copy back is. On a CPU device (the
Triton interpreter) a copy is a clone, so the wrapper runs the same lines.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

_STREAMS: dict = {}


def _streams(device: torch.device) -> tuple:
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _STREAMS:
        _STREAMS[key] = (torch.cuda.Stream(key), torch.cuda.Stream(key))
    return _STREAMS[key]


@dataclasses.dataclass(frozen=True)
class HostCopies:
    """A wrapper's copies for one device; `begin()` gives one call's."""
    device: Optional[torch.device]

    def begin(self) -> "_Call":
        return _Call(self.device)


class _Call:
    def __init__(self, device: Optional[torch.device]):
        self.device = device
        self.cuda = device is not None and device.type == "cuda"
        self.waited = False
        if self.cuda:
            self.main = torch.cuda.current_stream(device)
            self.to_host, self.to_device = _streams(device)

    def save(self, x: torch.Tensor) -> torch.Tensor:
        """A host copy of x, started after what the main stream has queued."""
        if not self.cuda:
            return x.clone()
        host = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, pin_memory=True)
        self.to_host.wait_stream(self.main)
        with torch.cuda.stream(self.to_host):
            host.copy_(x, non_blocking=True)
        x.record_stream(self.to_host)
        return host

    def load(self, host: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.cuda.Event]]:
        """A device copy of `host` and the event the main stream waits for before reading it."""
        if not self.cuda:
            return host.clone(), None
        x = torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=self.device)
        if not self.waited:  # the forward's copies to host are done before any copy back
            self.to_device.wait_stream(self.to_host)
            self.waited = True
        self.to_device.wait_stream(self.main)  # x's memory may have been freed just now
        with torch.cuda.stream(self.to_device):
            x.copy_(host, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.to_device)
        return x, done

    def ready(self, done: Optional[torch.cuda.Event]) -> None:
        if done is not None:
            self.main.wait_event(done)
