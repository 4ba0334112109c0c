"""Memory / recompute trade-off report: one compile per memory budget, then measured peak memory
and step time. `tradeoff(model, inputs, loss_fn)` -> Tradeoff (table, CSV, JSON, PNG plot).
`torch_budgets=(1.0, 0.0)` adds torch.compile at those values of PyTorch's
`activation_memory_budget`, measured the same way in the same run, and whether trainc's points
dominate PyTorch's (for each of its points, a trainc point no slower and no larger).

Peak memory is measured, not estimated: CUDA uses torch.cuda.max_memory_allocated; CPU sums the
c10 allocator's alloc/free events recorded by torch.profiler (profile_memory=True).
"""
from __future__ import annotations

import contextlib
import copy
import csv
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from trainc import partition as _partition
from trainc import records
from trainc.api import compile as _compile

DEFAULT_BUDGETS = (None, 1.0, 0.75, 0.5, 0.25, 0.1, 0.0)
CUDA_METHOD = "torch.cuda.max_memory_allocated (peak above the step's starting allocation)"
CPU_METHOD = ("torch.profiler allocator events, profile_memory=True (peak of the running sum of "
              "CPU allocations/frees above the step's start)")
# Both methods: gradients are cleared before the measured step, so they count in its peak.


@dataclass(frozen=True)
class TradeoffRow:
    budget: str  # "None", a fraction, or bytes
    saved_bytes: int  # activations the forward keeps for backward (partition's count)
    recompute_flops: int  # estimated FLOPs the backward spends recomputing
    simulated_peak: int  # the partitioner's liveness estimate of activations (over graphs)
    peak_bytes: int  # measured
    step_ms: float  # measured median of forward + loss + backward
    pareto: bool = False  # not dominated in (peak_bytes, step_ms) by the same compiler's rows
    compiler: str = "trainc"  # or "torch.compile" (its partition counts are not known: 0)
    # the step's peak from the wrappers' memory plans, saved values, held outputs and
    # gradients (partition/step_peak.py; 0: not known, e.g. the aten backend)
    predicted_peak: int = 0
    host_bytes: int = 0  # of saved_bytes, those moved to host memory (offload)


@dataclass(frozen=True)
class Tradeoff:
    model: str
    device: str
    memory_method: str
    rows: tuple[TradeoffRow, ...]

    def table(self) -> str:
        # sim peak: the step's predicted peak (memory plans); partition sim: the partitioner's
        # activation-only liveness estimate it plans with
        head = ("compiler", "budget", "saved MiB", "host MiB", "recompute MFLOP",
                "sim peak MiB", "partition sim MiB", "peak MiB", "step ms", "pareto")
        rows = [head] + [(r.compiler, r.budget, f"{r.saved_bytes / 2**20:.3f}",
                          f"{r.host_bytes / 2**20:.3f}",
                          f"{r.recompute_flops / 1e6:.1f}",
                          f"{r.predicted_peak / 2**20:.3f}" if r.predicted_peak else "-",
                          f"{r.simulated_peak / 2**20:.3f}",
                          f"{r.peak_bytes / 2**20:.3f}", f"{r.step_ms:.2f}",
                          "*" if r.pareto else "") for r in self.rows]
        text = (f"{self.model} on {self.device}; peak memory: {self.memory_method}\n"
                + records.format_table(rows))
        undominated = self.undominated_torch_rows()
        if undominated is not None:
            text += ("trainc dominates torch.compile's points\n" if not undominated else
                     "torch.compile points no trainc point matches (<= its peak and step ms): "
                     + ", ".join(r.budget for r in undominated) + "\n")
        return text

    def undominated_torch_rows(self) -> Optional[list[TradeoffRow]]:
        """torch.compile's rows with no trainc row at <= their peak and <= their step time
        (None: the report has no torch.compile rows)."""
        ours = [r for r in self.rows if r.compiler == "trainc"]
        theirs = [r for r in self.rows if r.compiler != "trainc"]
        if not theirs:
            return None
        return [t for t in theirs if not any(o.peak_bytes <= t.peak_bytes and
                                             o.step_ms <= t.step_ms for o in ours)]

    def __str__(self) -> str:
        return self.table()

    def write(self, out_dir: str) -> dict[str, str]:
        """tradeoff.csv, tradeoff.json and tradeoff.png in out_dir; returns their paths."""
        os.makedirs(out_dir, exist_ok=True)
        paths = {k: os.path.join(out_dir, f"{self.model}_tradeoff.{k}")
                 for k in ("csv", "json", "png")}
        with open(paths["csv"], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(asdict(self.rows[0])))
            w.writeheader()
            w.writerows(asdict(r) for r in self.rows)
        with open(paths["json"], "w") as f:
            json.dump({"model": self.model, "device": self.device,
                       "memory_method": self.memory_method,
                       "rows": [asdict(r) for r in self.rows]}, f, indent=2)
        self.plot(paths["png"])
        return paths

    def plot(self, path: str) -> None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for compiler, color in (("trainc", "tab:red"), ("torch.compile", "tab:blue")):
            rows = [r for r in self.rows if r.compiler == compiler]
            if not rows:
                continue
            xs = [r.peak_bytes / 2**20 for r in rows]
            ys = [r.step_ms for r in rows]
            ax.scatter(xs, ys, color="tab:gray")
            for r, x, y in zip(rows, xs, ys):
                ax.annotate(r.budget, (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=8)
            front = sorted((r for r in rows if r.pareto), key=lambda r: r.peak_bytes)
            ax.plot([r.peak_bytes / 2**20 for r in front], [r.step_ms for r in front], "o-",
                    color=color, label=f"{compiler} Pareto frontier")
        ax.set_xlabel("measured peak memory (MiB)")
        ax.set_ylabel("step time (ms)")
        ax.set_title(f"{self.model}: memory vs step time ({self.device})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def tradeoff(model: torch.nn.Module, inputs: Sequence, loss_fn: Callable,
             budgets: Sequence = DEFAULT_BUDGETS, *, name: str = "model", steps: int = 5,
             out_dir: Optional[str] = None, progress: bool = True,
             torch_budgets: Sequence[float] = (), **compile_options: Any) -> Tradeoff:
    """Compile `model` once per budget; `loss_fn(output, inputs)` gives the scalar loss.
    `torch_budgets`: torch.compile at these `activation_memory_budget` values too."""
    for b in torch_budgets:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b <= 1:
            raise ValueError(f"trainc.report: torch_budgets takes fractions in [0, 1] "
                             f"(PyTorch's activation_memory_budget), got {b!r}")
    device = _device(model, inputs)
    runs = [("trainc", b) for b in budgets] + [("torch.compile", float(b)) for b in torch_budgets]
    rows = []
    for i, (compiler, budget) in enumerate(runs):
        if progress:
            print(f"[tradeoff {name}] {i + 1}/{len(runs)}: {compiler} budget {budget!r} ...",
                  file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            rows.append(_measure(model, inputs, loss_fn, budget, device, steps, compile_options)
                        if compiler == "trainc" else
                        _measure_torch(model, inputs, loss_fn, budget, device, steps))
        except _partition.BudgetError as e:
            print(f"[tradeoff {name}] skipped budget {budget!r}: {e}", file=sys.stderr)
            continue
        if progress:
            r = rows[-1]
            print(f"[tradeoff {name}]   peak {r.peak_bytes / 2**20:.2f} MiB, step "
                  f"{r.step_ms:.2f} ms ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    method = CUDA_METHOD if device.type == "cuda" else CPU_METHOD
    result = Tradeoff(name, str(device), method, tuple(
        _mark_pareto([r for r in rows if r.compiler == "trainc"]) +
        _mark_pareto([r for r in rows if r.compiler != "trainc"])))
    if out_dir is not None:
        result.write(out_dir)
    return result


def _measure(model, inputs, loss_fn, budget, device, steps, options) -> TradeoffRow:
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    fn = _compile(m, memory_budget=budget, **options)
    with records.recording() as recs, _partition.observing() as parts:
        _step(fn, m, inputs, loss_fn)
    peak, ms = _peak_and_time(fn, m, inputs, loss_fn, device, steps)
    sim = sum(p.memory.peak for p in parts if p.memory is not None)
    predicted = [r.predicted_peak for r in recs if r.training]
    return TradeoffRow(str(budget), sum(r.saved_bytes for r in recs),
                       sum(r.recompute_flops for r in recs), sim, peak, ms,
                       predicted_peak=sum(p.peak for p in predicted)
                       if predicted and None not in predicted else 0,
                       host_bytes=sum(d.nbytes for r in recs for d in r.decisions if d.offload))


def _measure_torch(model, inputs, loss_fn, budget: float, device, steps) -> TradeoffRow:
    """torch.compile (Inductor) with PyTorch's activation_memory_budget, which its partitioner
    reads when the graph compiles: a fresh Dynamo cache, the first step under the setting."""
    import torch._functorch.config as functorch_config
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    fn = torch.compile(m)
    with functorch_config.patch(activation_memory_budget=budget):
        _step(fn, m, inputs, loss_fn)
    peak, ms = _peak_and_time(fn, m, inputs, loss_fn, device, steps)
    return TradeoffRow(str(budget), 0, 0, 0, peak, ms, compiler="torch.compile")


def _peak_and_time(fn, m, inputs, loss_fn, device, steps) -> tuple[int, float]:
    """The measured peak of one step and the median ms of `steps` more."""
    _clear_grads(m)  # outside the measured region: the step's own gradients count in its peak
    peak = peak_bytes(lambda: _step(fn, m, inputs, loss_fn, clear=False), device)
    times = []
    for _ in range(max(steps, 1)):
        _sync(device)
        t0 = time.perf_counter()
        _step(fn, m, inputs, loss_fn)
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return peak, statistics.median(times)


def _clear_grads(model) -> None:
    for p in model.parameters():
        p.grad = None


def _step(fn, model, inputs, loss_fn, clear: bool = True) -> None:
    if clear:
        _clear_grads(model)
    xs = tuple(x.detach().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
               for x in inputs)
    loss_fn(fn(*xs), xs).backward()


def peak_bytes(run: Callable[[], object], device: torch.device) -> int:
    """Peak memory of `run` above what was allocated before it: CUDA's allocator statistics, or
    on CPU the running sum of the allocator events torch.profiler records, plus what trainc
    graphs that `run` uses hold between calls: the arenas of cpp graphs (`cpp_keep_buffers`)
    and the private pools of CUDA graphs (`cudagraphs`). Allocated before `run`, they hold
    memory all through it."""
    from trainc.codegen.wrapper import held_arenas
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        with held_arenas() as held:
            run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start + sum(held.values())
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with held_arenas() as held:
        with _quiet_stderr():  # Kineto prints "USDT: ... profiler_start" at any log level
            prof.__enter__()
        try:
            run()
        finally:
            with _quiet_stderr():
                prof.__exit__(None, None, None)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    cur = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak + sum(held.values())


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 (C++ writes there, not to sys.stderr) to /dev/null for the block."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _mark_pareto(rows: list[TradeoffRow]) -> list[TradeoffRow]:
    def dominated(r: TradeoffRow) -> bool:
        return any(o.peak_bytes <= r.peak_bytes and o.step_ms <= r.step_ms
                   and (o.peak_bytes < r.peak_bytes or o.step_ms < r.step_ms) for o in rows)
    return [TradeoffRow(**{**asdict(r), "pareto": not dominated(r)}) for r in rows]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device(model, inputs) -> torch.device:
    for t in list(model.parameters()) + [x for x in inputs if isinstance(x, torch.Tensor)]:
        return t.device
    return torch.device("cpu")
