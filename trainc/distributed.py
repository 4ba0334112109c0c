"""Data-parallel wrappers in compile_step: DDP's gradient averaging traced into the step graph.

compile_step differentiates swapped-in copies of the parameters, so DDP's reducer (hooks on the
real parameters' gradient accumulators) never runs: the step graph averages the gradients itself,
bucket by bucket, with functional collectives. A wrapper or option whose semantics the step
cannot reproduce raises UnsupportedError, never a step on local gradients.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch
from torch.nn.parallel import DistributedDataParallel

from trainc.joint import UnsupportedError

_c10d = torch.ops._c10d_functional


@dataclass(frozen=True)
class GradSync:
    """How one compiled step averages gradients over a DDP process group."""
    group_name: str
    world: int
    first_bucket_bytes: int
    bucket_bytes: int
    reduced: tuple[bool, ...]  # per used parameter: DDP reduces it (not in parameters_to_ignore)


def ddp_of(model: torch.nn.Module) -> Optional[DistributedDataParallel]:
    """The DDP wrapper compile_step must reproduce (None for a plain module); refuses sharded
    and tensor-parallel models, which the step cannot trace correctly."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):  # DDP and FSDP both need one
        return None
    _refuse_sharded(model)
    if not isinstance(model, DistributedDataParallel):
        return None
    _refuse_options(model)
    return model


def _refuse_sharded(model: torch.nn.Module) -> None:
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    for name, m in model.named_modules():
        if isinstance(m, (FSDPModule, FullyShardedDataParallel)):
            raise UnsupportedError(
                f"trainc.compile_step: {name or 'the model'} is sharded with FSDP "
                f"({type(m).__name__}); the step cannot trace its all-gathers and reduce-scatters "
                "yet. Use trainc.compile(model) with an eager loss.backward() and "
                "optimizer.step(), or wrap the model in DistributedDataParallel instead.")
        if isinstance(m, DistributedDataParallel) and m is not model:
            raise UnsupportedError(f"trainc.compile_step: DistributedDataParallel nested inside "
                                   f"the model ({name}); pass the DDP wrapper itself")
    from torch.distributed.tensor import DTensor
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            raise UnsupportedError(f"trainc.compile_step: parameter {name} is a DTensor "
                                   "(sharded or tensor-parallel); unsupported")


def _refuse_options(ddp: DistributedDataParallel) -> None:
    """DDP features that change which gradients are reduced, or how."""
    hook = ddp._get_ddp_logging_data().get("comm_hook")
    problems = [
        (ddp.find_unused_parameters, "find_unused_parameters=True (the step traces which "
         "parameters get gradients; construct DDP with find_unused_parameters=False)"),
        (bool(hook) or bool(ddp._comm_hooks), f"a registered communication hook ({hook})"),
        (hasattr(ddp, "buffer_hook"), "a registered buffer communication hook"),
        (ddp.mixed_precision is not None, "DDP's mixed_precision"),
        (bool(ddp._delay_all_reduce_params), "delay_all_reduce_named_params"),
        (ddp._use_python_reducer, "the python reducer (optimize_ddp='python_reducer')"),
        (ddp._join_config.enable, "the Join context manager"),
        (any(getattr(m, "sparse", False) is True for m in ddp.modules()), "sparse gradients"),
    ]
    for bad, what in problems:
        if bad:
            raise UnsupportedError(f"trainc.compile_step of DistributedDataParallel: {what} is "
                                   "not supported; use trainc.compile(model) with an eager "
                                   "loss.backward() and optimizer.step() instead")


def grad_sync(ddp: Optional[DistributedDataParallel],
              names: Sequence[str]) -> Optional[GradSync]:
    """The averaging this step needs for the used parameters `names` (DDP wrapper names); None
    without DDP, or inside `no_sync()`, where eager DDP keeps the local gradients."""
    if ddp is None or not ddp.require_backward_grad_sync:
        return None
    ignored = {f"module.{n}" for n in ddp.parameters_to_ignore}
    cfg = ddp._bucket_config
    return GradSync(ddp.process_group.group_name, ddp.process_group.size(),
                    cfg.first_bucket_bytes_cap, cfg.bucket_bytes_cap,
                    tuple(n not in ignored for n in names))


@contextlib.contextmanager
def traced_forward(ddp: Optional[DistributedDataParallel]) -> Iterator[None]:
    """While tracing, calling the DDP wrapper runs only its module: DDP's forward would prepare
    its reducer for a backward that never comes (compile_step reduces in the graph instead)."""
    if ddp is None:
        yield
        return
    module = ddp.module
    ddp.forward = lambda *args, **kwargs: module(*args, **kwargs)
    try:
        yield
    finally:
        del ddp.forward


def sync_buffers_before(ddp: Optional[DistributedDataParallel]) -> None:
    """What eager DDP's forward does around the module with buffers: broadcast them from rank 0
    (when due) and note whether the next forward must do so again."""
    if ddp is None:
        return
    if ddp._check_sync_bufs_pre_fwd():
        ddp._sync_buffers()
    ddp.require_forward_param_sync = torch.is_grad_enabled() and ddp.require_backward_grad_sync


def average_grads(grads: list, sync: GradSync) -> list:
    """Traced: DDP's bucketed all-reduce of the gradients, each scaled by 1/world first (the
    reducer's order); buckets in reverse parameter order, as the reducer first builds them.
    Every bucket's collective is issued before the first wait, so they overlap each other."""
    buckets = _buckets(grads, sync)
    pending = [_c10d.all_reduce(torch.cat([grads[i].reshape(-1) for i in b]) * (1.0 / sync.world),
                                "sum", sync.group_name) for b in buckets]
    out = list(grads)
    for bucket, work in zip(buckets, pending):
        pieces = torch.split(_c10d.wait_tensor(work), [grads[i].numel() for i in bucket])
        for i, piece in zip(bucket, pieces):
            out[i] = piece.view(grads[i].shape)
    return out


def _buckets(grads: list, sync: GradSync) -> list[list[int]]:
    buckets: list[list[int]] = []
    open_: dict[tuple, tuple[list[int], int]] = {}  # (dtype, device) -> (bucket, bytes)
    for i in reversed(range(len(grads))):
        if not sync.reduced[i]:
            continue
        g = grads[i]
        key = (g.dtype, g.device)
        bucket, size = open_.get(key, ([], 0))
        if not bucket:
            buckets.append(bucket)
        bucket.append(i)
        size += g.numel() * g.element_size()
        cap = sync.first_bucket_bytes if len(buckets) == 1 else sync.bucket_bytes
        open_[key] = (bucket, size) if size < cap else ([], 0)
    return buckets
