"""Whole training step (forward, loss, backward, AdamW) on the shared suite: eager vs torch.compile
vs trainc.compile_step, in one process, interleaved, median of many steps.

    python benchmarks/step_suite.py --scale gpu [--dtypes float32,bfloat16] [--iters 20]
        [--modes eager_foreach,eager_fused,inductor,trainc] [names...]

Modes: eager_foreach (AdamW foreach), eager_fused (AdamW fused=True), inductor (torch.compile of
the model, of the loss, and of optimizer.step), trainc (trainc.compile_step). Prints one JSON
line per (model, dtype, mode) and a markdown table: median step ms, peak MiB above the starting
allocation (CUDA only), first-call seconds.
"""
from __future__ import annotations

import argparse
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

MODES = ("eager_foreach", "eager_fused", "inductor", "trainc")


def make_step(mode: str, model, loss, device: str, backend: str):
    lf = lambda m, *xs: loss(m(*xs), xs)
    if mode == "trainc":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return trainc.compile_step(model, lf, opt, backend=backend)
    fused = mode == "eager_fused"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None,
                            foreach=None if fused else True)
    fwd, opt_step = model, opt.step
    if mode == "inductor":
        fwd = torch.compile(model)
        loss = torch.compile(loss)
        opt_step = torch.compile(opt.step)

    def step(*xs):
        l = loss(fwd(*xs), xs)
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


def run_model(name: str, dtype: torch.dtype, args, device: str) -> list[dict]:
    entries = {}
    for mode in args.modes:
        torch._dynamo.reset()
        model, inputs, loss = models.build(name, device, args.scale, dtype)
        xs = tuple(x.detach() for x in inputs)
        step = make_step(mode, model, loss, device, args.backend)
        t0 = time.perf_counter()
        step(*xs)
        sync(device)
        first = time.perf_counter() - t0
        step(*xs)  # second call: optimizer state exists, trainc's steady graph is built
        sync(device)
        peak = None
        if device == "cuda":
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step(*xs)
            sync(device)
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        entries[mode] = dict(step=step, xs=xs, first=first, peak=peak, times=[], model=model)
        print(f"  built {name} {dtype} {mode}: first call {first:.2f} s", file=sys.stderr,
              flush=True)
    for _ in range(args.iters):  # interleaved: one step of each mode per round
        for mode, e in entries.items():
            e["times"].append(time_one(e["step"], e["xs"], device))
    rows = []
    for mode, e in entries.items():
        rows.append(dict(model=name, dtype=str(dtype).replace("torch.", ""), mode=mode,
                         step_ms=round(statistics.median(e["times"]), 3),
                         peak_mib=None if e["peak"] is None else round(e["peak"], 1),
                         first_call_s=round(e["first"], 2)))
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
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    args.modes = args.modes.split(",")
    device = "cuda" if args.scale == "gpu" else "cpu"
    rows = []
    for dtype in args.dtypes.split(","):
        for name in args.names or models.NAMES:
            rows += run_model(name, getattr(torch, dtype), args, device)
    print("\n| model | dtype | mode | step ms | peak MiB | first call s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['dtype']} | {r['mode']} | {r['step_ms']} | {r['peak_mib']} "
              f"| {r['first_call_s']} |")


if __name__ == "__main__":
    main()
