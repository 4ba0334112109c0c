"""CPU/GPU benchmark: eager vs torch.compile (Inductor) vs trainc on the shared models.

Per model: first-call seconds (compile), then median step ms over interleaved steps in one
process (each round in a fresh random order, seeded), and trainc's kernel count. On CUDA also
peak MiB and, for trainc's three largest generated kernels (bytes they must move, from the
scheduler), achieved bandwidth: bytes / median CUDA-event time, against 4.3 TB/s. Usage:
  python benchmarks/suite.py --scale cpu [--dtype bfloat16] [--iters 20] [--write BENCHMARKS.md]
`--threads 1` times steps in thread CPU time (a loaded shared box skews 2-thread wall time);
first-call seconds are then the process's CPU seconds too.
`--first-call fresh` reports each compiler's first call measured in a new process with empty
caches (Triton, Inductor, trainc) instead of in the benchmark process, where a compiler that
runs after another starts with that one's state (CUDA, imports, environment). Per model and
compiler the median of `--first-reps` processes, the compilers' order alternating per rep.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for _bench in (os.path.join(HERE, "suite_models"),):
    if os.path.isdir(_bench):
        sys.path.insert(0, os.path.abspath(_bench))
import models  # noqa: E402

import trainc  # noqa: E402
from trainc import records, runtime  # noqa: E402

MODES = ("eager", "inductor", "trainc")
PEAK_BYTES_PER_S = 4.3e12  # measured copy bandwidth of the H200 (DESIGN.md)


def _compiled(mode: str, model, backend: str):
    if mode == "eager":
        return model
    if mode == "inductor":
        return torch.compile(model)
    return trainc.compile(model, backend=backend)


def bench(name: str, scale: str, dtype: torch.dtype, iters: int, backend: str,
          clocks=(time.perf_counter, time.perf_counter)) -> dict:
    """`clocks`: (step clock, first-call clock)."""
    device = "cuda" if scale == "gpu" else "cpu"
    clock, first_clock = clocks
    torch._dynamo.reset()
    runs, row = {}, {"model": name, "dtype": str(dtype).replace("torch.", "")}
    for mode in MODES:
        m, x, loss = models.build(name, device, scale, dtype)
        with records.recording() as recs:
            t0 = first_clock()  # compile() too: work it starts early is part of the first call
            fn = _compiled(mode, m, backend)
            step = (lambda fn=fn, x=x, loss=loss: models.step(fn, x, loss))
            step()
            _sync(device)
            row[f"{mode}_first_s"] = first_clock() - t0
        if mode == "trainc":
            row["kernels"] = sum(len(r.kernels) for r in recs)
            row["fallbacks"] = sorted({op for r in recs for op in r.fallback_ops})
            runtime.wait_for_background_compiles()  # steps below: the steady state
        for _ in range(2):
            step()
        if device == "cuda":  # peak above the starting allocation, one steady-state step
            _sync(device)
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step()
            _sync(device)
            row[f"{mode}_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        runs[mode] = (step, [])
    order = random.Random(0)
    for _ in range(iters):  # a fresh order each round: a fixed one favours the later modes
        for mode in order.sample(MODES, len(MODES)):
            step, times = runs[mode]
            _sync(device)
            t0 = clock()
            step()
            _sync(device)
            times.append((clock() - t0) * 1e3)
    for mode in MODES:
        row[f"{mode}_ms"] = statistics.median(runs[mode][1])
    if device == "cuda":
        row["bandwidth"] = kernel_bandwidth(runs["trainc"][0])
    return row


CACHE_ENV = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRAINC_CACHE_DIR")


def fresh_first_calls(name: str, a, reps: int) -> dict:
    """{mode}_first_s for inductor and trainc, each the median over `reps` new processes with
    empty caches (`first_call_child`)."""
    times = {"inductor": [], "trainc": []}
    for rep in range(reps):
        for mode in (("inductor", "trainc") if rep % 2 == 0 else ("trainc", "inductor")):
            dirs = {k: tempfile.mkdtemp(prefix="suite-first-") for k in CACHE_ENV}
            try:
                out = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--first-child", mode,
                     "--scale", a.scale, "--dtype", a.dtype, "--backend", a.backend, name],
                    env={**os.environ, **dirs}, capture_output=True, text=True, check=True)
            except subprocess.CalledProcessError as e:
                raise RuntimeError(f"first call of {mode} on {name} failed:\n{e.stderr[-3000:]}")
            finally:
                for d in dirs.values():
                    shutil.rmtree(d, ignore_errors=True)
            times[mode].append(json.loads(out.stdout.strip().splitlines()[-1])["first_s"])
    return {f"{mode}_first_s": statistics.median(t) for mode, t in times.items()}


def first_call_child(mode: str, name: str, a) -> None:
    """One eager step (device, cuBLAS/cuDNN initialised, as in `bench`), then the first call
    of `mode`'s compiled model, timed; prints {"first_s": s}."""
    device = "cuda" if a.scale == "gpu" else "cpu"
    m, x, loss = models.build(name, device, a.scale, getattr(torch, a.dtype))
    models.step(m, x, loss)
    _sync(device)
    torch._dynamo.reset()  # imports Dynamo (seconds) before the clock, as anchor_inductor.py
    t0 = time.perf_counter()
    fn = _compiled(mode, m, a.backend)
    models.step(fn, x, loss)
    _sync(device)
    print(json.dumps({"first_s": time.perf_counter() - t0}), flush=True)
    if mode == "trainc":
        runtime.wait_for_background_compiles()
        if device == "cuda":  # idle compile workers would outlive the print
            from trainc.codegen.triton import compile_pool
            compile_pool.shutdown()


def kernel_bandwidth(step, top: int = 3, reps: int = 5) -> list[dict]:
    """The `top` generated kernels moving the most bytes: median time and achieved bandwidth
    (each launch timed alone with CUDA events while `step` runs `reps` times)."""
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
        t = statistics.median(ms)
        bw = nbytes / (t * 1e-3) if t > 0 else 0.0
        rows.append({"kernel": info.name, "ops": ",".join(info.nodes[:3]), "mb": nbytes / 1e6,
                     "us": t * 1e3, "gbps": bw / 1e9, "pct": 100 * bw / PEAK_BYTES_PER_S})
    rows.sort(key=lambda r: -r["mb"])
    return rows[:top]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def table(rows: list[dict]) -> str:
    head = ("model", "dtype", "eager ms", "inductor ms", "trainc ms", "trainc/inductor",
            "trainc/eager", "inductor first s", "trainc first s", "kernels", "fallbacks",
            "eager MiB", "inductor MiB", "trainc MiB")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = (r["model"], r["dtype"], f"{r['eager_ms']:.2f}", f"{r['inductor_ms']:.2f}",
                 f"{r['trainc_ms']:.2f}", f"{r['trainc_ms'] / r['inductor_ms']:.2f}",
                 f"{r['trainc_ms'] / r['eager_ms']:.2f}", f"{r['inductor_first_s']:.1f}",
                 f"{r['trainc_first_s']:.1f}", str(r["kernels"]), str(len(r["fallbacks"])),
                 *(f"{r[m + '_peak_mib']:.0f}" if m + "_peak_mib" in r else "-" for m in MODES))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" + bandwidth_table(rows)


def bandwidth_table(rows: list[dict]) -> str:
    if not any(r.get("bandwidth") for r in rows):
        return ""
    head = ("model", "dtype", "kernel", "first ops", "MB moved", "us", "GB/s", "% of 4.3 TB/s")
    lines = ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        for k in r.get("bandwidth", []):
            lines.append(f"| {r['model']} | {r['dtype']} | {k['kernel']} | {k['ops']} | "
                         f"{k['mb']:.1f} | {k['us']:.1f} | {k['gbps']:.0f} | {k['pct']:.0f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: as is)")
    ap.add_argument("--write", default=None, help="append the table to this markdown file")
    ap.add_argument("--first-call", choices=("process", "fresh"), default="process",
                    help="first-call seconds in this process, or in new processes, cold caches")
    ap.add_argument("--first-reps", type=int, default=1)
    ap.add_argument("--first-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    if a.first_child:
        first_call_child(a.first_child, a.names[0], a)
        return
    rows, clocks = [], (time.perf_counter, time.perf_counter)
    if a.threads:
        torch.set_num_threads(a.threads)
        if a.threads == 1:
            clocks = (time.thread_time, time.process_time)
    for name in a.names or models.NAMES:
        rows.append(bench(name, a.scale, getattr(torch, a.dtype), a.iters, a.backend, clocks))
        if a.first_call == "fresh":
            rows[-1].update(fresh_first_calls(name, a, a.first_reps))
        print(rows[-1], flush=True)
    text = table(rows)
    print(text)
    if a.write:
        cmd = "python benchmarks/suite.py " + " ".join(sys.argv[1:])
        with open(a.write, "a") as f:
            f.write(f"\n## {datetime.date.today()} — `{cmd}` (torch {torch.__version__}, "
                    f"{os.cpu_count()} CPUs)\n\n{text}")


if __name__ == "__main__":
    main()
