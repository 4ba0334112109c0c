"""The driver: captured graph + inputs -> runnable Artifact, one line per stage."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import time
from typing import Sequence

import torch
import torch.fx as fx

from trainc import artifact_cache, debug, records
from trainc.accumulate import accumulating_backward, plan_accumulation
from trainc.codegen import compile_workers, compiles_natively_on_cuda, get_backend
from trainc.codegen.cudagraphs import mark_static_inputs
from trainc.config import Config
from trainc.graph import InputKind
from trainc.joint import trace_joint
from trainc.partition import partition
from trainc.passes import (JOINT_PASSES, POST_GRAD_PASSES, check_mutations, enabled,
                           mark_mutable_inputs, run_passes)
from trainc.runtime import Artifact, ExpandedBackwards


def compile_graph(gm: fx.GraphModule, args: Sequence, kinds: Sequence[InputKind],
                  training: bool, config: Config) -> Artifact:
    with no_cyclic_gc():
        return _compile_graph(gm, args, kinds, training, config)


def _compile_graph(gm: fx.GraphModule, args: Sequence, kinds: Sequence[InputKind],
                   training: bool, config: Config) -> Artifact:
    t0, gid = time.perf_counter(), debug.next_graph_id()
    key, status = artifact_cache.key_and_reason(gm, args, kinds, training, config)
    if key is not None:
        cached, status = artifact_cache.load(key, config)
        if cached is not None:  # compiled by an earlier process: nothing to trace or generate
            art, record = cached
            records.publish(dataclasses.replace(record, graph_id=gid, cache="hit",
                                                compile_seconds=time.perf_counter() - t0), config)
            return art
    with compile_workers(config.backend, _device(args), config, len(gm.graph.nodes)):
        art, record = _compile(gm, args, kinds, training, config, gid, t0)
    if art.expanded is not None:
        art.expanded.cache = (key, config)
    stored = artifact_cache.store(key, art, record, config)
    records.publish(dataclasses.replace(record, cache=f"{status}; {stored}" if key else status),
                    config)
    return art


@contextlib.contextmanager
def no_cyclic_gc():
    """Python's cyclic garbage collector paused while a graph compiles (re-enabled after, when
    it was on): its full collections scan every object of the process (torch's included)
    and took 0.29 s of a CPU gpt or convnet first call (11-19%). Garbage made meanwhile is
    collected afterwards."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _compile(gm: fx.GraphModule, args: Sequence, kinds: Sequence[InputKind], training: bool,
             config: Config, gid: int, t0: float) -> tuple[Artifact, records.GraphRecord]:
    dump = debug.Dumper(config, gid)
    joint = trace_joint(gm, args, kinds, training, config.fuse_attention)
    dump.graph("00_joint.py", joint.gm, "joint graph after functionalization")
    dump.lap("trace")
    joint = dataclasses.replace(joint, gm=run_passes(
        joint.gm, enabled(JOINT_PASSES, "joint", config.skip_passes), dump=dump))
    dump.lap("joint passes")
    backend = get_backend(config.backend, _device(args), config)
    part = partition(joint, _objective(config, joint.gm, backend.name)) \
        if joint.signature.training else None
    dump.lap("partition")
    post = enabled(POST_GRAD_PASSES, "post_grad", config.skip_passes) + \
        ([check_mutations] if config.check_mutations else [])
    fwd_gm = run_passes(mark_mutable_inputs(part.fwd if part else joint.gm, joint.signature), post)
    plan = plan_accumulation(part.bwd, joint.signature, args, config.accumulate_grads) \
        if part and config.accumulate_grads is not False and backend.name == "cpp" else None
    acc_gm = run_passes(accumulating_backward(part.bwd, plan), post) if plan else None
    bwd_gm = run_passes(part.bwd, post) if part else None
    dump.lap("post-grad passes")
    stays = [i.name for i in joint.signature.inputs if i.kind in (InputKind.PARAM,
                                                                   InputKind.BUFFER)]
    fwd = backend.compile(mark_static_inputs(fwd_gm, stays), _example_inputs(fwd_gm))
    dump.lap("codegen forward")
    bwd = _compile_backward(backend, fwd, bwd_gm, joint.signature.num_fwd_outputs)
    bwd_acc = _compile_backward(backend, fwd, acc_gm, joint.signature.num_fwd_outputs)
    dump.lap("codegen backward")
    expanded = ExpandedBackwards(functools.partial(
        _compile_for_tangents, backend, bwd_gm, len(joint.signature.tangents)),
        background=config.background_compile and  # where compiles are slow, the GPU busy
        compiles_natively_on_cuda(backend.name, _device(args))) \
        if bwd_gm is not None else None
    art = Artifact(joint.signature, fwd, bwd, bwd_acc, plan, expanded)
    record = records.GraphRecord.make(gid, joint, part, fwd_gm, bwd_gm, fwd, bwd, backend.name,
                                     time.perf_counter() - t0)
    _dump_outputs(dump, part, fwd_gm, bwd_gm, fwd, bwd)
    dump.kernel_plans(forward=fwd, backward=bwd, backward_accumulate=bwd_acc)
    dump.kernels(forward=fwd, backward=bwd, backward_accumulate=bwd_acc)
    if bwd_acc is not None:
        dump.graph("32_bwd_accumulate.py", acc_gm, "backward graph adding into .grad")
        dump.text("32_bwd_accumulate_wrapper.py", bwd_acc.source)
        dump.memory("43_bwd_accumulate_memory.txt", bwd_acc)
    dump.lap("records and dumps")
    dump.finish()
    return art, record


def _compile_backward(backend, fwd, bwd_gm, n_fwd_outputs: int):
    if bwd_gm is None:
        return None
    _saved_layouts(fwd, bwd_gm, n_fwd_outputs)
    return backend.compile(mark_static_inputs(bwd_gm, ()), _example_inputs(bwd_gm))


def _compile_for_tangents(backend, bwd_gm: fx.GraphModule, n_tangents: int, strides: list):
    """The backward again, its tangent placeholders (the last ones) given these strides (None:
    as traced); the saved values keep the layouts _saved_layouts gave them."""
    tangents = [n for n in bwd_gm.graph.nodes if n.op == "placeholder"][-n_tangents:]
    traced = [n.meta.get("val") for n in tangents]
    try:
        for node, val, stride in zip(tangents, traced, strides):
            if stride is not None:
                node.meta["val"] = val.new_empty_strided(val.shape, stride)
        return backend.compile(bwd_gm, _example_inputs(bwd_gm))
    finally:
        for node, val in zip(tangents, traced):
            node.meta["val"] = val


_CONV_OR_POOL = ("convolution", "max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool")


def _objective(config: Config, gm: fx.GraphModule, backend: str) -> Config:
    """Config with the partition objective resolved (Config.partition_objective: None means
    "balanced" on cpp for graphs without convolutions or pooling, else "bytes")."""
    if config.partition_objective is not None:
        return config
    conv = any(n.op == "call_function" and any(k in str(n.target) for k in _CONV_OR_POOL)
               for n in gm.graph.nodes)
    objective = "balanced" if backend == "cpp" and not conv else "bytes"
    return dataclasses.replace(config, partition_objective=objective)


def _dump_outputs(dump, part, fwd_gm, bwd_gm, fwd, bwd) -> None:
    if part is not None:
        dump.text("20_partition.txt", records.decision_table(part.decisions))
    dump.graph("30_fwd.py", fwd_gm, "forward graph" if part else "inference graph")
    dump.text("30_fwd_wrapper.py", fwd.source)
    dump.memory("43_fwd_memory.txt", fwd)
    if bwd_gm is not None:
        dump.graph("31_bwd.py", bwd_gm, "backward graph")
        dump.text("31_bwd_wrapper.py", bwd.source)
        dump.memory("43_bwd_memory.txt", bwd)


def _saved_layouts(fwd, bwd_gm: fx.GraphModule, n_fwd_outputs: int) -> None:
    """The backward takes the saved values in the layouts the compiled forward returns them
    (a generated backend may store one channels-last): its placeholders say so, or every call
    would copy them back to the traced layout."""
    strides = fwd.extra.get("output_strides")
    if not strides:
        return
    saved = strides[n_fwd_outputs:]
    placeholders = [n for n in bwd_gm.graph.nodes if n.op == "placeholder"]
    for node, stride in zip(placeholders, saved):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and stride is not None and \
                tuple(val.stride()) != stride and len(stride) == val.dim():
            node.meta["val"] = val.new_empty_strided(val.shape, stride)


def _example_inputs(gm: fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def _device(args: Sequence) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
            return a.device
    return torch.device("cpu")
