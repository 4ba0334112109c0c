"""What the recipes share: the eager/trainc step, the timed training loops (one run, or several
interleaved step by step), the comparison tables."""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

import trainc
import trainc.records
from trainc.report import peak_bytes


def add_args(ap: argparse.ArgumentParser, steps: int) -> None:
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--budget", type=float, default=None,
                    help="trainc memory_budget fraction (0: least memory); works in both modes")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--mode", choices=("step", "model"), default="step",
                    help="step: trainc.compile_step (whole step); model: trainc.compile(model)")


def check_args(ap: argparse.ArgumentParser, args) -> None:
    if args.budget is not None and not 0.0 <= args.budget <= 1.0:
        ap.error("--budget is a fraction in [0, 1] of the activation bytes saving everything takes")


def make_step(model, opt, loss_fn: Callable, args, compiled: bool) -> Callable:
    """One training step as a function of the batch: eager, or compiled by trainc."""
    options = dict(backend=args.backend, memory_budget=args.budget)
    if compiled and args.mode == "step":
        return trainc.compile_step(model, loss_fn, opt, **options)
    forward = trainc.compile(model, **options) if compiled else model

    def step(*batch):
        loss = loss_fn(forward, *batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


@dataclass
class Run:
    losses: list
    times: list  # seconds per step
    peak_mib: float  # one extra step after training, measured (see peak_mib)
    records: tuple  # trainc's GraphRecords of the compiles during training (for the report)


def train(step: Callable, batches: Iterable, device: str, label: str, after_step=None) -> Run:
    """Run the loop, then measure the peak memory of one more step on the last batch."""
    losses, times = [], []
    with trainc.records.recording() as recs:
        for batch in batches:
            t0 = time.perf_counter()
            loss = step(*batch)
            if after_step is not None:
                after_step()
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
    peak = peak_mib(lambda: step(*batch), device)
    print(f"  {label}: final loss {losses[-1]:.3f}, peak {peak:.1f} MiB", flush=True)
    return Run(losses, times, peak, tuple(recs))


def peak_mib(run: Callable[[], object], device: str) -> float:
    """Peak MiB of `run` above what was allocated before it (trainc.report.peak_bytes)."""
    return peak_bytes(run, torch.device(device)) / 2**20


def compare(eager: Run, compiled: Run, items_per_step: int, unit: str) -> None:
    el, et, tl, tt = eager.losses, eager.times, compiled.losses, compiled.times
    print(f"\n{'step':>4}  {'eager loss':>10}  {'trainc loss':>11}  {'eager ms':>8}  "
          f"{'trainc ms':>9}")
    for i, (a, b, c, d) in enumerate(zip(el, tl, et, tt)):
        print(f"{i:>4}  {a:>10.4f}  {b:>11.4f}  {c * 1e3:>8.1f}  {d * 1e3:>9.1f}")
    skip = min(3, len(et) - 1)  # the first steps include trainc's compile
    me, mt = statistics.median(et[skip:]), statistics.median(tt[skip:])
    print(f"\nmedian step after warm-up: eager {me * 1e3:.1f} ms, trainc {mt * 1e3:.1f} ms "
          f"({me / mt:.2f}x); throughput eager {items_per_step / me:.0f}, trainc "
          f"{items_per_step / mt:.0f} {unit}/s; trainc first step {tt[0]:.2f} s (with compile)")
    print(f"peak memory of one step: eager {eager.peak_mib:.1f} MiB, trainc "
          f"{compiled.peak_mib:.1f} MiB ({compiled.peak_mib / max(eager.peak_mib, 1e-9):.2f}x)")
    print(f"loss fell from {el[0]:.3f} to {el[-1]:.3f} (eager), {tl[0]:.3f} to {tl[-1]:.3f} "
          "(trainc)\n")


def train_together(steps: dict[str, Callable], batches: Iterable, device: str,
                   after_step=None, every: int = 10) -> dict[str, Run]:
    """Step every run on the same batch in turn (so a busy machine slows them alike); then
    measure each one's peak memory on one more step. `after_step(label)` runs after each."""
    losses = {k: [] for k in steps}
    times = {k: [] for k in steps}
    with trainc.records.recording() as recs:
        for i, batch in enumerate(batches):
            for label, step in steps.items():
                t0 = time.perf_counter()
                loss = step(*batch)
                if after_step is not None:
                    after_step(label)
                if device == "cuda":
                    torch.cuda.synchronize()
                times[label].append(time.perf_counter() - t0)
                losses[label].append(loss.item())
            if (i + 1) % every == 0:
                print(f"  step {i + 1}: loss " + ", ".join(
                    f"{k} {v[-1]:.3f}" for k, v in losses.items()), flush=True)
    return {k: Run(losses[k], times[k], peak_mib(lambda: steps[k](*batch), device), tuple(recs))
            for k in steps}


def compare_all(runs: dict[str, Run], items_per_step: int, unit: str) -> None:
    """One row per run: median step after warm-up, throughput, peak memory, first step."""
    skip = 3  # the first steps include the compiles
    base = statistics.median(next(iter(runs.values())).times[skip:])
    print(f"\n{'':<14} {'median ms':>9} {unit + '/s':>9} {'speed':>6} {'peak MiB':>9} "
          f"{'memory':>7} {'first step s':>12} {'final loss':>10}")
    peak0 = next(iter(runs.values())).peak_mib
    for label, r in runs.items():
        med = statistics.median(r.times[skip:])
        print(f"{label:<14} {med * 1e3:>9.1f} {items_per_step / med:>9.0f} {base / med:>5.2f}x "
              f"{r.peak_mib:>9.1f} {r.peak_mib / peak0:>6.2f}x {r.times[0]:>12.2f} "
              f"{r.losses[-1]:>10.3f}")
    print("(speed and memory relative to the first row; peak: one step, above what was "
          "allocated before it)\n")
