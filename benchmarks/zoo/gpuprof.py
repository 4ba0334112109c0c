"""Where a zoo model's GPU step time goes, per kernel class, for each compiler.

Classes come from kernel names: matmul, attention, generated (Triton) reductions and pointwise,
the loss, copies and layout changes, other ATen kernels; "gaps" is wall time minus kernel time
(launch and host stalls). Used by run.py --profile.
"""
from __future__ import annotations

import collections
import re
import statistics

import torch

CLASSES = (
    ("attention", r"flash|fmha|attention|sdpa|cutlass.*attn"),
    ("matmul", r"gemm|cutlass|nvjet|xmma|sm90_|sm80_|cublas|splitK|ampere_|hopper"),
    ("loss", r"log_softmax|nll_loss|cross_entropy"),
    ("norm", r"norm|rsqrt|var_mean"),
    ("copy", r"copy|Memcpy|Memset|transpose|cat_|CatArray|fill"),
    ("generated", r"^triton_|^kernel\d|^k\d|triton"),
)
PEAK_BYTES_PER_S = 4.3e12  # measured H200 copy bandwidth (DESIGN.md)


def classify(kernel: str) -> str:
    for cls, pat in CLASSES:
        if re.search(pat, kernel, re.IGNORECASE):
            return cls
    return "other_aten"


def profile_step(step, reps: int = 3) -> dict:
    """Kernel ms per step by class, launches per step, wall ms and the top kernels."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        start.record()
        for _ in range(reps):
            step()
        end.record()
        torch.cuda.synchronize()
    wall = start.elapsed_time(end) / reps
    by_kernel = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            t = getattr(ev, "device_time_total", None) or ev.cuda_time_total
            by_kernel[ev.name][0] += 1
            by_kernel[ev.name][1] += t / 1e3 / reps
    classes = collections.Counter()
    for name, (_, ms) in by_kernel.items():
        classes[classify(name)] += ms
    kernel_ms = sum(classes.values())
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1][1])[:25]
    return {"wall_ms": wall, "kernel_ms": kernel_ms, "gaps_ms": wall - kernel_ms,
            "launches": sum(c for c, _ in by_kernel.values()) / reps,
            "classes": dict(classes.most_common()),
            "top": [(name[:100], round(ms, 3), c / reps) for name, (c, ms) in top]}


def generated_kernels(step, reps: int = 3, top: int = 20) -> list:
    """trainc's generated kernels by total time per step: ops, bytes, launches, bandwidth."""
    from trainc.codegen.triton.launch import profile_kernels
    with profile_kernels() as prof:
        for _ in range(reps):
            step()
    rows = []
    for launcher, ms in prof.items():
        info = launcher.info
        if info is None or not ms:
            continue
        nbytes = info.bytes_read + info.bytes_written
        each = statistics.median(ms)
        rows.append({"kernel": info.name, "ops": ",".join(info.nodes[:6]),
                     "ms_per_step": sum(ms) / reps, "launches": len(ms) / reps,
                     "mb": nbytes / 1e6, "us": each * 1e3,
                     "pct_bw": 100 * nbytes / (each * 1e-3) / PEAK_BYTES_PER_S if each else 0})
    rows.sort(key=lambda r: -r["ms_per_step"])
    return rows[:top]
