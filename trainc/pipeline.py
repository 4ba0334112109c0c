"""The driver: captured graph + inputs -> runnable Artifact, one line per stage."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import gc
import time
from typing import Sequence

import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import _use_lazy_graph_module

from trainc import (artifact_cache, chunked_loss, debug, decisions, offloading, records,
                    sdpa_rewrite)
from trainc.accumulate import accumulating_backward, plan_accumulation
from trainc.codegen import (Backend, CompiledGraph, compile_workers, compiles_natively_on_cuda,
                            get_backend, memory_models, memory_planner, target_for)
from trainc.codegen.cudagraphs import mark_static_inputs
from trainc.codegen.memory.offload import OFFLOAD
from trainc.config import Config, resolve
from trainc.graph import InputKind, graph_device
from trainc.joint import trace_joint
from trainc.partition import build_partition, partition, with_moved
from trainc.partition.step_peak import plans_step_peak
from trainc.partition.variants import chooses_variants, partition_variants
from trainc.passes import (JOINT_PASSES, POST_GRAD_PASSES, check_mutations, enabled,
                           fold_zero_tangents, mark_mutable_inputs, run_passes)
from trainc.runtime import ZERO_TANGENT, Artifact, ExpandedBackwards


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
            record = dataclasses.replace(record, graph_id=gid, cache="hit",
                                         compile_seconds=time.perf_counter() - t0)
            records.publish(decisions.check_ranks(record, config, decisions.default_group()),
                            config)
            return art
    with compile_workers(config.backend, graph_device(gm, args), config, len(gm.graph.nodes)):
        art, record = _compile(gm, args, kinds, training, config, gid, t0)
    if art.expanded is not None:
        art.expanded.cache = (key, config)
    stored = artifact_cache.store(key, art, record, config)
    record = dataclasses.replace(record, cache=f"{status}; {stored}" if key else status)
    records.publish(decisions.check_ranks(record, config, decisions.default_group()), config)
    return art


@contextlib.contextmanager
def no_cyclic_gc():
    """Python's cyclic garbage collector paused while a graph compiles (re-enabled after, when
    it was on): its full collections scan every object of the process (torch's included), a
    tenth of a first call and more (BENCHMARKS.md). Garbage made meanwhile is collected after."""
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
    sdpa = sdpa_rewrite.rewrite(gm) if config.sdpa_rewrite else 0
    joints = []
    for k, (v, chunked) in enumerate(_loss_variants(gm, config, training)):
        joint = trace_joint(v, args, kinds, training, config.fuse_attention)
        joints.append(dataclasses.replace(
            joint, chunked_losses=chunked, sdpa_rewrites=sdpa, gm=joint_passes(
                joint.gm, dump, "00_joint.py" if k == 0 else "00_joint_chunked_loss.py",
                "joint graph after functionalization" + (" (loss in row chunks)" if k else ""),
                config)))
    device = graph_device(joints[0].gm, args)
    config, backend = backend_for(config, device, convolutions=_convolutions(joints[0].gm))
    chosen, part = (0, None) if not joints[0].signature.training else \
        partition_variants(joints, config, _predictor(backend, config)) \
        if chooses_variants(config) else (0, partition(joints[0], config))
    joint = joints[chosen]
    dump.lap("partition")
    fwd_gm = post_grad(part.fwd if part else joint.gm, joint.signature, config)
    plan = plan_accumulation(part.bwd, joint.signature, args, config.accumulate_grads) \
        if part and config.accumulate_grads is not False and backend.target.accumulates_grads \
        else None
    acc_gm = post_grad(accumulating_backward(part.bwd, plan), None, config) if plan else None
    functional_bwd = _copy(part.bwd) if part else None  # post_grad reinplaces in place
    bwd_gm = post_grad(part.bwd, None, config) if part else None
    dump.lap("post-grad passes")
    stays = [i.name for i in joint.signature.inputs if i.kind in _STAYS_PUT]
    moves = part is not None and bool(part.offloaded) and backend.target.offloads
    bandwidth = offloading.host_bandwidth(device) if moves else 0.0
    if moves:
        fwd_gm.meta[OFFLOAD] = offloading.save_request(fwd_gm, part, bandwidth)
    fwd = generate(backend, fwd_gm, stays)
    if part is not None and part.offloaded:
        moved = offloading.request_loads([bwd_gm, acc_gm], part, fwd_gm,
                                         fwd.extra.get("offloaded_outputs", ()), bandwidth) \
            if moves else ()
        part = with_moved(part, moved, offloading.kept_why(backend.name, moves))
    dump.lap("codegen forward")
    bwd = _compile_backward(backend, fwd, bwd_gm, joint.signature.num_fwd_outputs)
    bwd_acc = _compile_backward(backend, fwd, acc_gm, joint.signature.num_fwd_outputs)
    dump.lap("codegen backward")
    expanded = ExpandedBackwards(functools.partial(
        _compile_for_tangents, backend, bwd_gm, functional_bwd, len(joint.signature.tangents),
        config),
        background=variants_in_background(config, device)) if bwd_gm is not None else None
    art = Artifact(joint.signature, fwd, bwd, bwd_acc, plan, expanded)
    record = records.GraphRecord.make(gid, joint, part, fwd_gm, bwd_gm, fwd, bwd, backend.name,
                                     time.perf_counter() - t0)
    record = dataclasses.replace(record, decision_record=decisions.make(
        config, list(zip(kinds, args)), part,
        {"fwd": fwd, "bwd": bwd, "bwd_accumulate": bwd_acc}, record.passes))
    if part is not None:
        dump.text("20_partition.txt", records.decision_table(part.decisions))
    if part is not None and part.search:
        dump.text("21_budget_search.txt", part.search)
    dump.compiled("30", "fwd", fwd_gm, fwd, "forward graph" if part else "inference graph")
    dump.compiled("31", "bwd", bwd_gm, bwd, "backward graph")
    dump.compiled("32", "bwd_accumulate", acc_gm, bwd_acc, "backward graph adding into .grad")
    dump.codegen(forward=fwd, backward=bwd, backward_accumulate=bwd_acc)
    dump.kernels(forward=fwd, backward=bwd, backward_accumulate=bwd_acc)
    dump.lap("records and dumps")
    dump.finish()
    return art, record


def _loss_variants(gm: fx.GraphModule, config: Config,
                   training: bool) -> list[tuple[fx.GraphModule, int]]:
    """The graphs to trace, each with its count of LM-head losses in row chunks
    (trainc/chunked_loss.py): chunk_loss True chunks in place; "auto" (a budget's default) adds a
    chunked copy beside the graph, and the partitioner uses it only where the cap needs it."""
    if not training or not config.chunk_loss:
        return [(gm, 0)]
    if config.chunk_loss is True:
        return [(gm, chunked_loss.rewrite(gm))]
    if not chooses_variants(config):
        return [(gm, 0)]
    chunked = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    n = chunked_loss.rewrite(chunked)
    return [(gm, 0), (chunked, n)] if n else [(gm, 0)]


# -- stages shared by trainc.compile and compile_step (trainc/step.py) -----------------------
_STAYS_PUT = (InputKind.PARAM, InputKind.BUFFER)


def joint_passes(gm: fx.GraphModule, dump: debug.Dumper, file: str, what: str,
                 config: Config) -> fx.GraphModule:
    """The traced graph dumped, then the joint passes (dce, cse, noops, constants, patterns)
    but those Config.skip_passes names."""
    dump.graph(file, gm, what)
    dump.lap("trace")
    gm = run_passes(gm, enabled(JOINT_PASSES, "joint", config.skip_passes), dump=dump)
    dump.lap("joint passes")
    return gm


def backend_for(config: Config, device: torch.device, step: bool = False,
                convolutions: bool = False) -> tuple[Config, Backend]:
    """The config with its defaults decided for the backend's capabilities (config.resolve)
    and the backend made with it."""
    config = resolve(config, target_for(config.backend, device), device.type, step=step,
                     convolutions=convolutions)
    return config, get_backend(config.backend, device, config)


def post_grad(gm: fx.GraphModule, signature, config: Config,
              check: bool = True) -> fx.GraphModule:
    """Post-grad passes (reinplacing, cleanups); with `signature`, the inputs it lets the graph
    write first marked mutable. `check`: Config.check_mutations applies (compile_step's
    in-place optimizer updates are not what passes/check_mutations proves)."""
    if signature is not None:
        gm = mark_mutable_inputs(gm, signature)
    checks = [check_mutations] if check and config.check_mutations else []
    return run_passes(gm, enabled(POST_GRAD_PASSES, "post_grad", config.skip_passes) + checks)


def generate(backend: Backend, gm: fx.GraphModule, stays: Sequence[str]) -> CompiledGraph:
    """One graph through the backend; `stays`: its inputs that keep their memory between calls
    (parameters, buffers, optimizer state: CUDA graphs capture them in place)."""
    return backend.compile(mark_static_inputs(gm, stays), _example_inputs(gm))


def _predictor(backend: Backend, config: Config):
    """For a memory budget's search (partition/variants.py): per joint graph, a plan -> its
    predicted step peak (partition/step_peak.py) from the memory plans the backend would give
    the plan's two graphs after the post-grad passes; None where the backend makes no plan."""
    planner = memory_planner(backend)
    if planner is None:
        return None
    if config.offload and backend.target.offloads:
        return _offload_predictor(backend, config)

    def for_joint(joint, costs):
        def predict(plan) -> int:
            fwd_gm, bwd_gm, part = _trial_graphs(joint, costs, plan, config)
            return plans_step_peak(part, planner(fwd_gm, _example_inputs(fwd_gm)),
                                   planner(bwd_gm, _example_inputs(bwd_gm))).peak
        return predict
    return for_joint


def _offload_predictor(backend: Backend, config: Config):
    """_predictor's search where saved values may move to host memory (trainc/offloading.py)."""
    models = memory_models(backend)
    bandwidth = None

    def for_joint(joint, costs):
        nonlocal bandwidth
        if bandwidth is None:
            bandwidth = offloading.host_bandwidth(graph_device(joint.gm))

        def build(plan):
            fwd_gm, bwd_gm, part = _trial_graphs(joint, costs, plan, config)
            return part, fwd_gm, bwd_gm
        return offloading.BudgetOffload(
            build, lambda gm: models(gm, _example_inputs(gm)),
            lambda part, f, b, moved: plans_step_peak(part, f, b, False, moved), bandwidth)
    return for_joint


def _trial_graphs(joint, costs, plan, config: Config) -> tuple:
    """(forward, backward, partition) of a budget's trial plan after the post-grad passes, as
    lazy GraphModules: only lowered for their memory plans, never run, so the Python code fx
    regenerates at each split and pass (a sixth of a prediction) is never made."""
    with _use_lazy_graph_module(True):
        part = build_partition(joint, costs, list(plan.saved), "budget", None, observe=False)
        return post_grad(part.fwd, joint.signature, config), post_grad(part.bwd, None,
                                                                         config), part


def variants_in_background(config: Config, device: torch.device) -> bool:
    """Whether backward variants (runtime.ExpandedBackwards) compile in a thread: where
    compiles are slow and the GPU busy, and no memory budget is set. Until a variant is ready,
    its calls run the traced backward on dense tangents: the zeros of a model's logits beside
    its loss can raise the peak above the budget's plan."""
    return config.background_compile and config.memory_budget is None and not config.offload \
        and compiles_natively_on_cuda(config.backend, device)


def _compile_backward(backend, fwd, bwd_gm, n_fwd_outputs: int):
    if bwd_gm is None:
        return None
    _saved_layouts(fwd, bwd_gm, n_fwd_outputs)
    return generate(backend, bwd_gm, ())


def _compile_for_tangents(backend, bwd_gm: fx.GraphModule, functional: fx.GraphModule,
                          n_tangents: int, config: Config, layout: list):
    """The backward again for one tangent layout (runtime.ExpandedBackwards): per tangent None
    (as traced), its strides (it arrives expanded) or ZERO_TANGENT (nobody differentiated that
    output: the functional backward is folded with it as a known zero, then post-grad passes
    as usual). The saved values keep the layouts _saved_layouts gave them."""
    zeros = [k == ZERO_TANGENT for k in layout]
    gm = _zero_tangent_backward(functional, n_tangents, zeros, config) if any(zeros) else bwd_gm
    if OFFLOAD in bwd_gm.meta:  # saved values that arrive on the host, as in bwd_gm
        gm.meta[OFFLOAD] = bwd_gm.meta[OFFLOAD]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    traced = [n.meta.get("val") for n in placeholders]
    try:
        if gm is not bwd_gm:  # the saved values' layouts, as the forward returns them
            refs = [n for n in bwd_gm.graph.nodes if n.op == "placeholder"]
            for node, ref in zip(placeholders, refs):
                node.meta["val"] = ref.meta.get("val")
        for node, stride in zip(placeholders[-n_tangents:], layout):
            if isinstance(stride, tuple):
                node.meta["val"] = node.meta["val"].new_empty_strided(node.meta["val"].shape,
                                                                      stride)
        return backend.compile(gm, _example_inputs(gm))
    finally:
        for node, val in zip(placeholders, traced):
            node.meta["val"] = val


def _zero_tangent_backward(functional: fx.GraphModule, n_tangents: int, zeros: list,
                           config: Config) -> fx.GraphModule:
    gm = _copy(functional)
    tangents = [n for n in gm.graph.nodes if n.op == "placeholder"][-n_tangents:]
    gm = fold_zero_tangents(gm, [t.name for t, z in zip(tangents, zeros) if z])
    return post_grad(gm, None, config)


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return fx.GraphModule(gm, graph)


_CONV_OR_POOL = ("convolution", "max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool")


def _convolutions(gm: fx.GraphModule) -> bool:
    """Convolutions or pooling in the graph: the partition objective's default is "bytes" then
    (config.resolve)."""
    return any(n.op == "call_function" and any(k in str(n.target) for k in _CONV_OR_POOL)
               for n in gm.graph.nodes)


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
