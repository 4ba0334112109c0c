"""The memory/recompute frontier on one machine: trainc at a sweep of memory budgets beside
torch.compile at the same values of PyTorch's `activation_memory_budget`, measured with the same
step, the same peak counter (trainc.report.peak_bytes: allocator peak above the start, plus the
arenas trainc graphs hold) and median step times, in one process.

Usage: python benchmarks/budget_frontier.py [--scale gpu] [--dtype bfloat16] [--with-loss] [--out DIR] names...
Names are shared-suite models (benchmarks/suite_models), or `zoo:NAME` for a zoo model at its real scale
(its own loss is inside the compiled graph). `--with-loss` compiles a shared model together with
its loss, so both compilers see the LM head and the loss in one graph.
Writes frontier.json / frontier.csv to --out.
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import statistics
import sys
import time

import torch

os.environ["TRAINC_CACHE_ARTIFACTS"] = "0"  # a cache hit skips the partition whose peak we report
import trainc
from trainc import partition as _partition
from trainc.report import peak_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "suite_models"))

TRAINC_BUDGETS = "none,0.5,0.2,0.0"
TORCH_BUDGETS = "1.0,0.5,0.2,0.0"


def _budget(s: str):
    return None if s == "none" else float(s)


def _step(fn, model, call):
    for p in model.parameters():
        p.grad = None
    call(fn).backward()


class WithLoss(torch.nn.Module):
    """A shared-suite model and its loss as one module: one graph for the compiler."""

    def __init__(self, model, loss):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, *x):
        return self.loss(self.model(*x), x)


def case(name: str, device, scale: str, dtype, with_loss: bool):
    """(module to compile, call(fn) -> loss) for a shared-suite or zoo model."""
    if name.startswith("zoo:"):
        sys.path.insert(0, HERE)
        from zoo import models as zoo_models
        c = zoo_models.build(name[4:], "real" if scale == "gpu" else "tiny", device.type, dtype)
        return c.model, lambda fn, batch=c.batch: fn(**batch).loss
    import models
    model, x, loss = models.build(name, device.type, scale, dtype)
    if with_loss:
        return WithLoss(model, loss), lambda fn: fn(*x)
    return model, lambda fn: loss(fn(*x), x)


def measure(compiler: str, budget, model, call, device, iters: int, options: dict) -> dict:
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    if compiler == "trainc":
        fn = trainc.compile(m, memory_budget=budget, **options)
    else:
        import torch._functorch.config as fconfig
        fconfig.activation_memory_budget = 1.0 if budget is None else budget
        fn = torch.compile(m)
    t0 = time.perf_counter()
    with _partition.observing() as parts:
        _step(fn, m, call)
    _step(fn, m, call)
    first = time.perf_counter() - t0
    sim = sum(p.memory.peak for p in parts if p.memory is not None) / 2**20
    for p in m.parameters():
        p.grad = None
    peak = peak_bytes(lambda: call(fn).backward(), device)
    times = []
    for _ in range(iters):
        torch.cuda.synchronize() if device.type == "cuda" else None
        t = time.perf_counter()
        _step(fn, m, call)
        torch.cuda.synchronize() if device.type == "cuda" else None
        times.append((time.perf_counter() - t) * 1e3)
    if compiler == "torch.compile":
        import torch._functorch.config as fconfig
        fconfig.activation_memory_budget = 1.0
    return dict(compiler=compiler, budget=budget, options=options, step_ms=statistics.median(times),
                peak_mib=peak / 2**20, sim_mib=sim, first_two_s=first,
                saved=sorted(p.saved_bytes for p in parts))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="gpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--trainc-budgets", default=TRAINC_BUDGETS)
    ap.add_argument("--torch-budgets", default=TORCH_BUDGETS)
    ap.add_argument("--variant", action="append", default=[],
                    help="extra trainc row BUDGET:OPTION=VALUE (e.g. none:triton_keep_buffers=0)")
    ap.add_argument("--with-loss", action="store_true",
                    help="compile each shared model together with its loss")
    ap.add_argument("--out", default="frontier")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    device = torch.device("cuda" if a.scale == "gpu" else "cpu")
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for name in a.names or ["gpt", "normact"]:
        model, call = case(name, device, a.scale, getattr(torch, a.dtype), a.with_loss)
        runs = [("trainc", _budget(b), {}) for b in a.trainc_budgets.split(",")]
        runs += [("torch.compile", float(b), {}) for b in a.torch_budgets.split(",")]
        for v in a.variant:
            b, opt = v.split(":")
            k, val = opt.split("=")
            runs.append(("trainc", _budget(b), {k: bool(int(val))}))
        for compiler, budget, options in runs:
            r = dict(model=name, **measure(compiler, budget, model, call, device, a.iters,
                                           options))
            rows.append(r)
            print(json.dumps(r), flush=True)
            torch.cuda.empty_cache() if device.type == "cuda" else None
    with open(os.path.join(a.out, "frontier.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(a.out, "frontier.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("| model | compiler | budget | options | step ms | peak MiB | simulated MiB |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['compiler']} | {r['budget']} | {r['options'] or ''} | "
              f"{r['step_ms']:.2f} | {r['peak_mib']:.0f} | {r['sim_mib']:.0f} |")


if __name__ == "__main__":
    main()
