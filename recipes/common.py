"""What the recipes share: the eager/trainc step, the timed training loop, the comparison table."""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Iterable

import torch

import trainc


def add_args(ap: argparse.ArgumentParser, steps: int) -> None:
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--budget", type=float, default=None, help="trainc memory_budget fraction")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--mode", choices=("step", "model"), default="step",
                    help="step: trainc.compile_step (whole step); model: trainc.compile(model)")


def check_args(ap: argparse.ArgumentParser, args) -> None:
    if args.budget is not None and args.mode == "step":
        ap.error("--budget applies to --mode model (compile_step has no autograd boundary yet)")


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


def train(step: Callable, batches: Iterable, device: str, label: str, after_step=None):
    """Run the loop; returns (losses, seconds per step)."""
    losses, times = [], []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for batch in batches:
        t0 = time.perf_counter()
        loss = step(*batch)
        if after_step is not None:
            after_step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    print(f"  {label}: final loss {losses[-1]:.3f}"
          + (f", peak {peak:.0f} MiB" if peak is not None else ""), flush=True)
    return losses, times


def compare(eager: tuple, compiled: tuple, items_per_step: int, unit: str) -> None:
    (el, et), (tl, tt) = eager, compiled
    print(f"\n{'step':>4}  {'eager loss':>10}  {'trainc loss':>11}  {'eager ms':>8}  "
          f"{'trainc ms':>9}")
    for i, (a, b, c, d) in enumerate(zip(el, tl, et, tt)):
        print(f"{i:>4}  {a:>10.4f}  {b:>11.4f}  {c * 1e3:>8.1f}  {d * 1e3:>9.1f}")
    skip = min(3, len(et) - 1)  # the first steps include trainc's compile
    me, mt = statistics.median(et[skip:]), statistics.median(tt[skip:])
    print(f"\nmedian step after warm-up: eager {me * 1e3:.1f} ms, trainc {mt * 1e3:.1f} ms "
          f"({me / mt:.2f}x); throughput eager {items_per_step / me:.0f}, trainc "
          f"{items_per_step / mt:.0f} {unit}/s; trainc first step {tt[0]:.2f} s (with compile)")
    print(f"loss fell from {el[0]:.3f} to {el[-1]:.3f} (eager), {tl[0]:.3f} to {tl[-1]:.3f} "
          "(trainc)\n")
