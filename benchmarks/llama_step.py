"""The ~1B Llama training step (zoo `llama` real, bf16, CUDA): compilers and trainc options side by
side in one process, interleaved.

    python benchmarks/llama_step.py --out DIR --modes eager,inductor,trainc,trainc:memory_budget=0.0
        [--iters 10] [--causal] [--profile trainc,inductor] [--fwd-profile trainc]

Modes: eager, inductor (torch.compile), inductor_b0 (PyTorch's activation_memory_budget=0; give it
a process of its own: the budget is read when the graph compiles, and a process that already
compiled the model with Inductor reuses that entry), trainc[:option=value...] (memory_budget takes
a number or none; other options 1/0). No Dynamo reset between modes: each compiler keeps its own
cache entries. Per mode: first call s, peak MiB (trainc.report.peak_bytes, gradients cleared
first so they count), gradients' relative L2 distance to eager's (float32, all parameters), then
the median of --iters interleaved rounds (a fresh random order each, CUDA events).
`--causal`: transformers' `_ignore_causal_mask_sdpa` skips the mask when there is no padding and
q_len == kv_len, as transformers >= 5.24 does under torch.compile (older versions build the mask
as a tensor there). `--fwd-profile MODE`: per kernel name, the whole step's ms next to a
forward-only run's (generated kernel names repeat across the forward and backward graphs).
Writes llama_step.json to --out.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zoo import gpuprof, models  # noqa: E402

import trainc  # noqa: E402
from trainc import records  # noqa: E402
from trainc.report import peak_bytes  # noqa: E402


def skip_causal_masks() -> None:
    from transformers import masking_utils
    original = masking_utils._ignore_causal_mask_sdpa

    def skip(padding_mask, query_length, kv_length, *args, **kwargs):
        return (padding_mask is None and query_length == kv_length) or \
            original(padding_mask, query_length, kv_length, *args, **kwargs)
    masking_utils._ignore_causal_mask_sdpa = skip


def compiled(mode: str, model):
    if mode == "eager":
        return model
    if mode == "inductor":
        return torch.compile(model)
    if mode == "inductor_b0":
        import torch._functorch.config as functorch_config
        functorch_config.activation_memory_budget = 0.0
        return torch.compile(model)
    name, *options = mode.split(":")
    if name != "trainc":
        raise SystemExit(f"llama_step: unknown mode {mode!r}")
    opts = dict(o.split("=", 1) for o in options)
    return trainc.compile(model, **{k: (None if v == "none" else float(v)
                                        if k == "memory_budget" else v == "1")
                                    for k, v in opts.items()})


def kernels_by_name(run, reps: int = 3) -> dict:
    from torch.profiler import ProfilerActivity, profile
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0.0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            agg[ev.name][0] += (getattr(ev, "device_time_total", None) or ev.cuda_time_total) \
                / 1e3 / reps
            agg[ev.name][1] += 1 / reps
    return agg


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="eager,inductor,trainc")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--profile", default="", help="modes to profile per kernel class")
    ap.add_argument("--fwd-profile", default="", help="a mode: per kernel, step vs forward ms")
    a = ap.parse_args(argv)
    if a.causal:
        skip_causal_masks()
    os.makedirs(a.out, exist_ok=True)
    torch._dynamo.config.cache_size_limit = 16
    case = models.build("llama", "real", "cuda", torch.bfloat16)
    params = list(case.model.parameters())
    modes = a.modes.split(",")
    res, steps, fns, eager_grads = {}, {}, {}, None

    for mode in modes:
        fn = fns[mode] = compiled(mode, case.model)

        def step(fn=fn):
            for p in params:
                p.grad = None
            fn(**case.batch).loss.backward()
        steps[mode] = step
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with records.recording() as recs:
            step()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        trainc.runtime.wait_for_background_compiles()  # the steady state below
        grads = [p.grad.float() for p in params]
        eager_grads = grads if mode == "eager" and eager_grads is None else eager_grads
        rel = None
        if eager_grads is not None:
            num = sum(((g - e) ** 2).sum() for g, e in zip(grads, eager_grads)).sqrt()
            rel = (num / sum((e ** 2).sum() for e in eager_grads).sqrt()).item()
        del grads
        step()
        for p in params:
            p.grad = None  # the step's own gradients count in its peak
        res[mode] = dict(first_s=round(first, 1),
                         peak_mib=round(peak_bytes(step, torch.device("cuda")) / 2**20),
                         grad_rel_l2_vs_eager=rel,
                         sdpa_rewrites=sum(r.sdpa_rewrites for r in recs),
                         chunked_losses=sum(r.chunked_losses for r in recs), graphs=len(recs),
                         predicted_mib=round(sum(r.predicted_peak.peak for r in recs
                                                 if r.training and r.predicted_peak) / 2**20),
                         host_mib=round(sum(d.nbytes for r in recs for d in r.decisions
                                            if d.offload) / 2**20),
                         notes=[n for r in recs for n in r.partition_notes if "budget" in n])
        print(mode, res[mode], flush=True)

    times = {m: [] for m in modes}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(a.iters):
        order = list(modes)
        random.Random(r).shuffle(order)
        for m in order:
            start.record()
            steps[m]()
            end.record()
            torch.cuda.synchronize()
            times[m].append(start.elapsed_time(end))
    base = next((m for m in ("inductor", "inductor_b0", "trainc") if m in times), modes[0])
    for m in modes:
        res[m]["step_ms"] = round(statistics.median(times[m]), 2)
        res[m][f"vs_{base}"] = round(res[m]["step_ms"] / statistics.median(times[base]), 3)
        print(m, res[m]["step_ms"], res[m][f"vs_{base}"], flush=True)
    for m in filter(None, a.profile.split(",")):
        res[m]["profile"] = gpuprof.profile_step(steps[m])
        print(m, {k: v for k, v in res[m]["profile"].items() if k != "top"}, flush=True)
    if a.fwd_profile:
        m = a.fwd_profile
        whole = kernels_by_name(steps[m])
        forward = kernels_by_name(lambda: fns[m](**case.batch))  # outputs dropped
        rows = sorted(((n[:90], round(t, 3), round(k), round(forward[n][0], 3),
                        round(forward[n][1])) for n, (t, k) in whole.items()),
                      key=lambda r: -r[1])
        res[m]["kernels: name, step ms, launches, forward ms, launches"] = rows[:60]
    with open(os.path.join(a.out, "llama_step.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
