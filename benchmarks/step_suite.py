"""Whole training step (forward, loss, backward, AdamW) on the shared suite: eager vs torch.compile
vs trainc.compile_step, in one process, interleaved, median of many steps.

    python benchmarks/step_suite.py --scale gpu [--dtypes float32,bfloat16] [--iters 20]
        [--modes eager_foreach,...] [--budget 0.0] [names...]

Modes: eager_foreach (AdamW foreach), eager_fused (AdamW fused=True), inductor (torch.compile of
the model, of the loss, and of optimizer.step), inductor_loss (model and loss in one compiled
function, optimizer.step compiled), inductor_budget (the inductor arrangement compiled under
torch._functorch.config.activation_memory_budget=--budget), trainc (trainc.compile_step),
trainc_budget (trainc.compile_step with memory_budget=--budget). Prints one JSON line per
(model, dtype, mode) and a markdown table: median step ms, peak MiB above the starting
allocation (CUDA: allocator statistics; CPU: torch.profiler allocator events), first-call s.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for bench in (os.path.join(HERE, "..", "..", "shared", "bench"),
              os.path.join(HERE, "..", "shared", "bench")):
    if os.path.isdir(bench):
        sys.path.insert(0, bench)

import models  # noqa: E402
import trainc  # noqa: E402
from trainc.report import peak_bytes  # noqa: E402

MODES = ("eager_foreach", "eager_fused", "inductor", "inductor_loss", "inductor_budget",
         "trainc", "trainc_budget")


def make_step(mode: str, model, loss, args):
    lf = lambda m, *xs: loss(m(*xs), xs)
    if mode.startswith("trainc"):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        budget = args.budget if mode == "trainc_budget" else None
        return trainc.compile_step(model, lf, opt, backend=args.backend, memory_budget=budget)
    fused = mode == "eager_fused"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None,
                            foreach=None if fused else True)
    forward_loss, opt_step = (lambda *xs: loss(model(*xs), xs)), opt.step
    if mode in ("inductor", "inductor_budget"):
        fwd, compiled_loss = torch.compile(model), torch.compile(loss)
        forward_loss, opt_step = (lambda *xs: compiled_loss(fwd(*xs), xs)), torch.compile(opt.step)
    elif mode == "inductor_loss":  # the loss inside the model's graph
        forward_loss, opt_step = torch.compile(forward_loss), torch.compile(opt.step)
    # PyTorch's budget is a global read when the joint graph is partitioned (first call and
    # any recompile), so every call runs under it.
    budget = (torch._functorch.config.patch(activation_memory_budget=args.budget)
              if mode == "inductor_budget" else contextlib.nullcontext())

    def step(*xs):
        with budget:
            l = forward_loss(*xs)
            l.backward()
            opt_step()
            opt.zero_grad(set_to_none=True)
        return l.detach()
    return step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_one(step, xs, device: str) -> float:
    if device == "cuda":
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step(*xs)
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e)
    t = time.perf_counter()
    step(*xs)
    return (time.perf_counter() - t) * 1e3


def peak_mib(step, xs, device: str) -> float:
    """Peak MiB of one step above what was allocated before it."""
    return peak_bytes(lambda: step(*xs), torch.device(device)) / 2**20


def run_model(name: str, dtype: torch.dtype, args, device: str) -> list[dict]:
    entries = {}
    for mode in args.modes:
        torch._dynamo.reset()
        model, inputs, loss = models.build(name, device, args.scale, dtype)
        xs = tuple(x.detach() for x in inputs)
        step = make_step(mode, model, loss, args)
        t0 = time.perf_counter()
        step(*xs)
        sync(device)
        first = time.perf_counter() - t0
        step(*xs)  # second call: optimizer state exists, trainc's steady graph is built
        peak = peak_mib(step, xs, device)
        entries[mode] = dict(step=step, xs=xs, first=first, peak=peak, times=[], model=model)
        print(f"  built {name} {dtype} {mode}: first call {first:.2f} s, peak {peak:.1f} MiB",
              file=sys.stderr, flush=True)
    for _ in range(args.iters):  # interleaved: one step of each mode per round
        for mode, e in entries.items():
            e["times"].append(time_one(e["step"], e["xs"], device))
    rows = []
    for mode, e in entries.items():
        rows.append(dict(model=name, dtype=str(dtype).replace("torch.", ""), mode=mode,
                         budget=args.budget if mode.endswith("_budget") else None,
                         step_ms=round(statistics.median(e["times"]), 3),
                         peak_mib=round(e["peak"], 1), first_call_s=round(e["first"], 2)))
        print(json.dumps(rows[-1]), flush=True)
    entries.clear()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="cpu")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--backend", default="auto", help="trainc backend")
    ap.add_argument("--budget", type=float, default=0.0,
                    help="memory budget of the *_budget modes (trainc memory_budget and "
                         "PyTorch's activation_memory_budget), a fraction in [0, 1]")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads (CPU; 1 avoids OpenMP thrashing on a busy box)")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.modes = args.modes.split(",")
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        ap.error(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    device = "cuda" if args.scale == "gpu" else "cpu"
    print(f"# torch {torch.__version__}, device {device}, scale {args.scale}, iters {args.iters},"
          f" trainc backend {args.backend}, {torch.get_num_threads()} threads; box load may skew"
          " CPU timings", flush=True)
    rows = []
    for dtype in args.dtypes.split(","):
        for name in args.names or models.NAMES:
            rows += run_model(name, getattr(torch, dtype), args, device)
    print("\n| model | dtype | mode | step ms | peak MiB | first call s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        mode = r["mode"] + (f" ({r['budget']})" if r["budget"] is not None else "")
        print(f"| {r['model']} | {r['dtype']} | {mode} | {r['step_ms']} | {r['peak_mib']} "
              f"| {r['first_call_s']} |")


if __name__ == "__main__":
    main()
