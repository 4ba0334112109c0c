"""Every knob of trainc: one frozen dataclass, built once per compile from options + environment.

`TRAINC_*` environment variables are read here and nowhere else.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Optional, Union

BACKENDS = ("auto", "aten", "cpp", "triton")


@dataclass(frozen=True)
class Config:
    backend: str = "auto"
    # None or 1.0: the speed-optimal partition; 0.0: the lowest-peak one; a float f between:
    # peak capped at low + f * (default - low); int: a cap in bytes on the predicted peak
    # (the graph's inputs plus its simulated peak). See partition/budget.py.
    memory_budget: Optional[Union[float, int]] = None
    # A memory budget may also move saved activations to pinned host memory between the forward
    # and the backward, copied on side streams (trainc/offloading.py; backends whose target
    # offloads: triton). trainc.policy("offload") regions move their values without it.
    offload: bool = False
    # "mincut": min-cut on the bytes/FLOPs cost model (partition/); "save_all" keeps every
    # value the backward reads (the reference partition). compile_step: the same choice inside
    # its one graph (recomputed copies placed before their first backward use).
    partitioner: str = "mincut"
    # Save policy (trainc.partition.policy.SavePolicy): which ops may be recomputed; None: default.
    policy: Optional[Any] = None
    # What the min-cut minimizes without a memory budget: "bytes" (the fewest saved bytes,
    # recompute cost breaking ties) or "balanced" (saved bytes + recompute cost, FLOPs at one
    # byte each). None (resolve()): the target's objective ("balanced" on cpp, where recompute
    # costs; "bytes" on GPUs, where it is cheap) for graphs without convolutions or pooling,
    # else "bytes" (a balanced convnet backward keeps masks GCC does not vectorize with).
    # Measurements: BENCHMARKS.md, session 23 driver section.
    partition_objective: Optional[str] = None
    debug: bool = False  # TRAINC_DEBUG=1: one summary line per compile
    debug_dir: Optional[str] = None  # TRAINC_DEBUG_DIR: dump every stage as runnable Python
    # backend="cpp": compiler (TRAINC_CXX), its flags (TRAINC_CPP_FLAGS) and the on-disk cache
    # of built kernels (TRAINC_CACHE_DIR; default ~/.cache/trainc).
    cpp_compiler: str = "g++"
    # -ffp-contract=off: no fused multiply-adds eager does not do (x*x - x*x must stay 0).
    cpp_flags: str = ("-O3 -march=native -fopenmp -fno-math-errno -fno-trapping-math "
                      "-ffp-contract=off -std=c++17 -w")
    cache_dir: Optional[str] = None
    # backend="cpp": allocate the buffers that never leave a compiled graph once, in one arena
    # planned like the wrapper's own allocations (about its planned peak), and keep it across
    # calls: freed memory goes back to the OS and fresh allocations page-fault on every call
    # (BENCHMARKS.md). The arena is held between calls; trainc.report.peak_bytes counts the
    # arenas a measured run uses.
    # Off when a memory_budget is set (the budget is about the planned peak alone).
    cpp_keep_buffers: bool = True
    # backend="cpp": also compile a backward that adds each parameter's gradient into its
    # existing .grad in place, right after computing it (trainc/accumulate.py), used when
    # autograd would do exactly that add (no tensor hooks, not torch.autograd.grad, ...).
    # Without it, gradients are returned as fresh tensors that AccumulateGrad adds after the
    # whole backward, from memory gone cold (BENCHMARKS.md). Only on a backend whose target
    # accumulates_grads. None: only for graphs whose parameter gradients take >=
    # accumulate.MIN_BYTES (below, its checks cost more than the add they save); True: always.
    # Hooks registered on the AccumulateGrad node itself (grad_fn.next_functions[i][0].
    # register_prehook) would see None: turn it off for code that does that.
    accumulate_grads: Optional[bool] = None
    # backend="triton": the same for the Triton wrapper's own buffers (one planned arena kept
    # across calls). Meant for CUDA graphs, whose private pool fragments when each large buffer
    # is allocated separately (BENCHMARKS.md); off by default until measured on the GPU.
    triton_keep_buffers: bool = False
    # Store compiled artifacts under cache_dir and load them in later processes, skipping
    # tracing and codegen (trainc/artifact_cache.py; TRAINC_CACHE_ARTIFACTS=0: off).
    cache_artifacts: bool = True
    # backend="triton": time a few launch configs per kernel on first run and cache the winner
    # on disk (TRAINC_TRITON_AUTOTUNE=0: heuristic configs, no tuning).
    triton_autotune: bool = True
    # ... only kernels that move at least this many bytes: below, a kernel is a few
    # microseconds whatever its launch config, and each candidate is one more Triton compile
    triton_tune_min_bytes: int = 16 << 20
    # backend="triton" on CUDA: launch a kernel compiled for these arguments through its
    # launcher directly, not through the JIT's per-call binding (codegen/triton/launch.py
    # Launcher._run; TRAINC_TRITON_FAST_LAUNCH=0: off)
    triton_fast_launch: bool = True
    # backend="triton": float32 division (and reciprocal) IEEE-rounded (`tl.div_rn`) instead of
    # Triton's `/` (div.full.f32: full range, NaN/Inf as IEEE, within 2 ulp; Inductor's choice).
    # Off: IEEE division is measurably slower (BENCHMARKS.md) and 2 ulp is far below
    # DESIGN.md's float32 floor (1e-5).
    # TRAINC_TRITON_PRECISE_DIV=1 turns it on. Always IEEE: floor-division, remainder, a
    # quotient that is floored/rounded/cast to an integer/compared, division by a constant.
    triton_precise_div: bool = False
    # backend="triton" on CUDA: processes (at most one per CPU and per captured graph node,
    # started before tracing) and threads compiling a graph's kernels concurrently at compile
    # time instead of one by one at their first launch (0 or 1: no precompile;
    # codegen/triton/compile_pool.py)
    triton_compile_workers: int = 16
    # backend="cpp": "auto" runs each float32/bfloat16 mm/addmm call site through oneDNN's
    # inner product instead of ATen's mm (MKL) where timing both at compile time says it is
    # faster (codegen/cpp/gemm.py); "aten": always ATen's. "auto" is "aten" under
    # torch.distributed with several ranks (resolve()): every rank must choose the same.
    # TRAINC_CPP_GEMM sets it.
    cpp_gemm: str = "auto"
    # backend="triton" on CUDA: a backward compiled again at a call whose tangents arrive in a
    # new expanded layout (out.sum()'s gradient) compiles in a background thread; until it is
    # ready, those calls run the traced backward on a dense copy of the tangent (as Inductor
    # does on every call): results within DESIGN.md's tolerance, not always the same bits as
    # the variant's later. False (TRAINC_BACKGROUND_COMPILE=0): compile it then, and wait.
    # Off under a memory_budget or offload (pipeline.variants_in_background): the dense copy
    # would raise the peak above the budget's plan.
    # trainc.runtime.wait_for_background_compiles() waits for them (benchmarks).
    background_compile: bool = True
    # TRAINC_CHECK_MUTATIONS=1: prove the post-grad graphs' mutations safe (passes/check_mutations)
    check_mutations: bool = False
    # replay each compiled graph as a CUDA graph (codegen/cudagraphs.py); CUDA tensors only.
    # "auto": captured only where codegen/cudagraphs.py worth_it says a replay pays (a step whose
    # copied inputs outweigh its launches is not). None (resolve()): "auto" for compile_step on
    # CUDA with a backend whose target replays by default (triton: parameters, buffers and
    # optimizer state stay put, so a replay copies in only the batch and the CPU scalars), else
    # False (trainc.compile: a replay would clone every saved activation out of the graph's
    # pool). TRAINC_CUDAGRAPHS=0/1 overrides the default.
    cudagraphs: Optional[Union[bool, str]] = None
    # trace explicit softmax(q @ k^T * s [causal mask]) @ v as scaled_dot_product_attention
    # (trainc/attention.py): its extern kernels never store the T x T scores
    fuse_attention: bool = True
    # scaled_dot_product_attention with a constant causal mask -> is_causal, and with repeated
    # KV heads -> enable_gqa (trainc/sdpa_rewrite.py): SDPA's causal kernels instead of masked ones
    sdpa_rewrite: bool = True
    # trace F.cross_entropy of a large linear's output (an LM head) as the linear and the loss
    # in row chunks (trainc/chunked_loss.py), so that a memory budget can recompute the logits
    # one chunk at a time in the backward. None: "auto" when a memory budget below 1.0 is set
    # (trainc.compile chunks only where no plan of the whole graph meets the budget's cap,
    # partition/variants.py; compile_step always chunks then), else False.
    chunk_loss: Optional[Union[bool, str]] = None
    # 2-D convolutions run channels-last (NHWC memory) and the normalizations, activations and
    # pooling around them follow. None (resolve()): the target's default: on for cpp (oneDNN
    # is faster there); on triton "eager_tf32": bfloat16/float16 convolutions (cuDNN runs them in
    # NHWC and converts NCHW around each one), and float32 ones only where eager's own NCHW call
    # runs TF32 at their shapes on this GPU (codegen/triton/tf32_probe.py), since cuDNN's NHWC
    # float32 gradients can exceed DESIGN.md's 2x-eager error rule. Measurements: BENCHMARKS.md.
    conv_channels_last: Optional[Union[bool, str]] = None
    # trainc.testing.bisect's switches. Passes not run, as "joint:<pass>" or "post_grad:<pass>"
    # (every occurrence of that function in passes.JOINT_PASSES / POST_GRAD_PASSES), and graph
    # nodes (by name, in whichever compiled graph holds them) run as ATen calls instead of
    # generated code: one kernel's nodes at a time, to find a wrong kernel.
    # Under torch.distributed with > 1 rank: compare each compiled graph's decision hash across
    # the ranks (trainc/decisions.py) and raise RankMismatchError where they differ, before
    # their collectives disagree or hang. TRAINC_CHECK_RANK_DECISIONS=0: off.
    check_rank_decisions: bool = True
    # trainc.compile of an nn.Module: "auto" compiles each group of repeated layers (an
    # nn.ModuleList / nn.Sequential with >= 2 children of one class and equal parameter shapes:
    # a transformer's blocks) as ONE graph that every layer runs, so first-call time stops
    # growing with depth (trainc/layer_regions.py); the module looping over them runs eagerly,
    # its other children and the model around it compile as graphs of their own. None: the whole
    # model as Dynamo captures it. A memory_budget fraction then applies to each graph alone
    # (every layer gets the same plan); an int budget is refused (no per-graph split of a byte
    # cap). Only trainc.compile takes it (compile_step and torch.compile(backend="trainc")
    # refuse it: there is no module call to split at there).
    regions: Optional[str] = None
    skip_passes: tuple[str, ...] = ()
    aten_nodes: tuple[str, ...] = ()


def _env_defaults() -> dict[str, Any]:
    return {
        "debug": os.environ.get("TRAINC_DEBUG", "") not in ("", "0"),
        "debug_dir": os.environ.get("TRAINC_DEBUG_DIR") or None,
        "cpp_compiler": os.environ.get("TRAINC_CXX") or Config.cpp_compiler,
        "cpp_flags": os.environ.get("TRAINC_CPP_FLAGS") or Config.cpp_flags,
        "cpp_gemm": os.environ.get("TRAINC_CPP_GEMM") or Config.cpp_gemm,
        "cache_dir": os.environ.get("TRAINC_CACHE_DIR") or None,
        "cache_artifacts": os.environ.get("TRAINC_CACHE_ARTIFACTS", "1") not in ("", "0"),
        "triton_precise_div": os.environ.get("TRAINC_TRITON_PRECISE_DIV", "0") not in ("", "0"),
        "triton_autotune": os.environ.get("TRAINC_TRITON_AUTOTUNE", "1") not in ("", "0"),
        "triton_fast_launch": os.environ.get("TRAINC_TRITON_FAST_LAUNCH", "1") not in ("", "0"),
        "background_compile": os.environ.get("TRAINC_BACKGROUND_COMPILE", "1") not in ("", "0"),
        "check_rank_decisions":
            os.environ.get("TRAINC_CHECK_RANK_DECISIONS", "1") not in ("", "0"),
        "check_mutations": os.environ.get("TRAINC_CHECK_MUTATIONS", "") not in ("", "0"),
        "cudagraphs": {"0": False, "1": True}.get(os.environ.get("TRAINC_CUDAGRAPHS", "")),
    }


def make_config(backend: str = "auto", memory_budget: Any = None, **options: Any) -> Config:
    """Validate user options and merge them over the environment defaults."""
    known = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"trainc: unknown option(s) {unknown}; known options: {sorted(known)}")
    if backend not in BACKENDS:
        raise ValueError(f"trainc: backend must be one of {BACKENDS}, got {backend!r}")
    _check_budget(memory_budget)
    objective = options.get("partition_objective")
    if objective not in (None, "bytes", "balanced"):
        raise ValueError(f"trainc: partition_objective must be None, 'bytes' or 'balanced', "
                         f"got {objective!r}")
    if options.get("cudagraphs") not in (None, True, False, "auto"):
        raise ValueError(f"trainc: cudagraphs must be None (the default), True, False or "
                         f"'auto', got {options['cudagraphs']!r}")
    if options.get("conv_channels_last") not in (None, True, False, "eager_tf32"):
        raise ValueError(f"trainc: conv_channels_last must be None (the default), True, False "
                         f"or 'eager_tf32', got {options['conv_channels_last']!r}")
    values = {**_env_defaults(), **options, "backend": backend, "memory_budget": memory_budget}
    if values.get("regions") not in (None, "auto"):
        raise ValueError(f"trainc: regions must be None (the default) or 'auto', got "
                         f"{values['regions']!r}")
    if values.get("regions") and isinstance(memory_budget, int) and not isinstance(memory_budget,
                                                                               bool):
        raise ValueError("trainc: an int memory_budget (a byte cap on the step's peak) cannot be "
                         "combined with regions='auto' yet: each layer is its own graph and "
                         "the cap is not split among them; use a fraction (applied per graph)")
    if values["cpp_gemm"] not in ("auto", "aten"):  # an option or TRAINC_CPP_GEMM
        raise ValueError(f"trainc: cpp_gemm must be 'auto' (the default) or 'aten', got "
                         f"{values['cpp_gemm']!r}")
    if values.get("chunk_loss") is None:
        values["chunk_loss"] = "auto" if memory_budget is not None and not (
            isinstance(memory_budget, float) and memory_budget == 1.0) else False
    if values["chunk_loss"] not in (True, False, "auto"):
        raise ValueError(f"trainc: chunk_loss must be None (the default), True, False or "
                         f"'auto', got {values['chunk_loss']!r}")
    return Config(**values)


def _check_budget(budget: Any) -> None:
    if budget is None:
        return
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(f"trainc: memory_budget must be None, a float in [0, 1] or an int of "
                        f"bytes, got {budget!r}")
    if isinstance(budget, float) and not 0.0 <= budget <= 1.0:
        raise ValueError(f"trainc: a float memory_budget is a fraction in [0, 1], got {budget}")
    if isinstance(budget, int) and budget < 0:
        raise ValueError(f"trainc: an int memory_budget is a byte count >= 0, got {budget}")


def resolve(config: Config, target: Any, device_type: str, step: bool = False,
            convolutions: bool = False) -> Config:
    """`config` with the defaults that depend on the backend, the device and the entry point
    decided (None means "decided here"); `target`: the backend's capabilities
    (codegen/target.py). `step`: compile_step's whole-step graph; `convolutions`: the graph
    has convolutions or pooling. accumulate_grads None stays: it is decided per graph by the
    gradients' bytes (trainc/accumulate.py)."""
    values: dict[str, Any] = {}
    if config.partition_objective is None:
        values["partition_objective"] = \
            "bytes" if step or convolutions else target.partition_objective
    if config.cudagraphs is None:
        on = step and device_type == "cuda" and target.cuda_graphs
        values["cudagraphs"] = "auto" if on else False
    if config.conv_channels_last is None:
        values["conv_channels_last"] = target.channels_last
    if config.cpp_gemm == "auto" and world_size() > 1:
        values["cpp_gemm"] = "aten"  # a timed choice can differ between ranks (#13 item 3)
    return dataclasses.replace(config, **values) if values else config


def world_size() -> int:
    """Ranks of the initialized torch.distributed group (1 without one)."""
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
