"""Whole training step (forward, loss, backward, AdamW) on the shared suite: eager vs torch.compile
vs trainc.compile_step, in one process per shard, interleaved, median of many steps.

    python benchmarks/step_suite.py --scale gpu --out DIR [--jobs 2] [--dtypes float32,bfloat16]
        [--iters 20] [--modes eager_foreach,...] [--budget 0.0] [--budget-models gpt] [names...]

Modes: eager_foreach (AdamW foreach), eager_fused (AdamW fused=True), inductor (torch.compile of
the model, of the loss, and of optimizer.step), inductor_loss (model and loss in one compiled
function, optimizer.step compiled), trainc (trainc.compile_step, default options: on CUDA it
replays a CUDA graph), trainc_cudagraphs / trainc_nographs / trainc_arena (the same with
cudagraphs=True / False / triton_keep_buffers=True; trainc_saveall: partitioner="save_all", no
recomputation; not in the default modes), and on
--budget-models only:
inductor_budget (the inductor arrangement under PyTorch's activation_memory_budget=--budget),
trainc_budget (compile_step with memory_budget=--budget). Per row: median step ms, peak MiB above
the starting allocation (CUDA: allocator statistics; CPU: torch.profiler allocator events; plus
the buffers trainc's cpp graphs keep between calls), first call s, last loss. Writes
DIR/step_suite.md (tables, trainc vs the best torch.compile arrangement) and
DIR/step_suite.json, rewritten after every model, so a run cut short keeps what it measured.
--jobs N splits the (dtype, model) list over N processes: one GPU each when there are enough,
else they share one and take turns (a file lock) for peak and timing.
--scale tiny: very small models (tests of this script's CPU path).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for bench in (os.path.join(HERE, "suite_models"),):
    if os.path.isdir(bench):
        sys.path.insert(0, bench)

import models  # noqa: E402
import trainc  # noqa: E402
from trainc.report import peak_bytes  # noqa: E402

MODES = ("eager_foreach", "eager_fused", "inductor", "inductor_loss", "trainc",
         "trainc_cudagraphs", "trainc_nographs", "trainc_arena", "trainc_saveall",
         "inductor_budget", "trainc_budget")
# not in the default modes
VARIANTS = ("trainc_cudagraphs", "trainc_nographs", "trainc_arena", "trainc_saveall")
COMPILED = ("inductor", "inductor_loss")  # the torch.compile arrangements trainc is held against
TINY = {"mlp": dict(d=32, depth=2, batch=16),
        "gpt": dict(vocab=64, d=32, heads=2, layers=1, seq=16, batch=2),
        "convnet": dict(width=8, blocks=2, hw=8, batch=4),
        "normact": dict(d=64, batch=32)}
WEIGHT = {"gpt": 3.0, "mlp": 2.0, "convnet": 2.0, "normact": 0.5}  # rough build-time shares


def make_step(mode: str, model, loss, args):
    lf = lambda m, *xs: loss(m(*xs), xs)
    if mode.startswith("trainc"):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        budget = args.budget if mode == "trainc_budget" else None
        extra = {"trainc_cudagraphs": {"cudagraphs": True},
                 "trainc_nographs": {"cudagraphs": False},
                 "trainc_arena": {"triton_keep_buffers": True},
                 "trainc_saveall": {"partitioner": "save_all"}}.get(mode, {})
        return trainc.compile_step(model, lf, opt, backend=args.backend, memory_budget=budget,
                                   **extra)
    fused = mode == "eager_fused"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None,
                            foreach=None if fused else True)
    forward_loss, opt_step = (lambda *xs: loss(model(*xs), xs)), opt.step
    if mode in ("inductor", "inductor_budget"):  # the anchor: loss outside the graph
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


def time_one(step, xs, device: str) -> tuple[float, torch.Tensor]:
    if device == "cuda":
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        loss = step(*xs)
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e), loss
    t = time.perf_counter()
    loss = step(*xs)
    return (time.perf_counter() - t) * 1e3, loss


def modes_for(name: str, args) -> list[str]:
    return [m for m in args.modes if not m.endswith("_budget") or name in args.budget_models]


def build(name: str, mode: str, dtype, args, device: str) -> dict:
    torch._dynamo.reset()
    model, inputs, loss = models.build(name, device, "cpu" if args.scale == "tiny" else
                                       args.scale, dtype)
    xs = tuple(x.detach() for x in inputs)
    step = make_step(mode, model, loss, args)
    t0 = time.perf_counter()
    step(*xs)
    sync(device)
    first = time.perf_counter() - t0
    step(*xs)  # second call: optimizer state exists, trainc's steady graph is built
    sync(device)
    return dict(step=step, xs=xs, first=first, times=[], model=model, loss=None)


def run_model(name: str, dtype: torch.dtype, args, device: str, lock) -> list[dict]:
    entries, rows = {}, []
    for mode in modes_for(name, args):
        try:
            entries[mode] = build(name, mode, dtype, args, device)
        except Exception as e:  # one broken mode must not lose the rest of a one-shot run
            rows.append(_row(name, dtype, mode, args, error=f"{type(e).__name__}: {e}"[:300]))
            print(f"  {name} {dtype} {mode} FAILED: {rows[-1]['error']}", file=sys.stderr)
            continue
        print(f"  built {name} {dtype} {mode}: first call {entries[mode]['first']:.2f} s",
              file=sys.stderr, flush=True)
    with lock:  # peak and timing only while no other shard measures on this device
        for mode, e in entries.items():
            # peak_bytes counts the arenas trainc's cpp graphs keep between calls; "kept" says
            # how much of the peak they are
            e["kept"] = getattr(e["step"], "kept_bytes", 0) / 2**20
            e["peak"] = peak_bytes(lambda: e["step"](*e["xs"]), torch.device(device)) / 2**20
        for _ in range(args.iters):  # interleaved: one step of each mode per round
            for e in entries.values():
                ms, e["loss"] = time_one(e["step"], e["xs"], device)
                e["times"].append(ms)
    for mode, e in entries.items():
        rows.append(_row(name, dtype, mode, args, step_ms=round(statistics.median(e["times"]), 3),
                         peak_mib=round(e["peak"], 2), kept_mib=round(e["kept"], 2),
                         first_call_s=round(e["first"], 2),
                         loss=float(e["loss"])))
        print(json.dumps(rows[-1]), flush=True)
    entries.clear()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def _row(name, dtype, mode, args, **kw) -> dict:
    return dict(model=name, dtype=str(dtype).replace("torch.", ""), mode=mode,
                budget=args.budget if mode.endswith("_budget") else None, **kw)


class _FileLock:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "w") if self.path else None
        if self.f:
            fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        if self.f:
            fcntl.flock(self.f, fcntl.LOCK_UN)
            self.f.close()


# -- report ---------------------------------------------------------------------------------
def _cell(r) -> str:
    if r is None:
        return ""
    if r.get("error"):
        return "error"
    return f"{r['step_ms']:.4g} / {r['peak_mib']:.5g} / {r['first_call_s']:.3g}"


def _geo(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0]  # a tiny model's peak can round to 0 MiB
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def markdown(rows: list[dict], header: str) -> str:
    get = {(r["model"], r["dtype"], r["mode"]): r for r in rows}
    return "\n".join([header, ""] + _summary(rows, get) + _budget_rows(rows, get)
                     + _all_rows(rows)) + "\n"


def _summary(rows: list[dict], get: dict) -> list[str]:
    """One line per (model, dtype), trainc against the best torch.compile arrangement."""
    main = [m for m in MODES if not m.endswith("_budget")]
    out = ["Cells: median step ms / peak MiB / first call s. Best torch.compile = the lower of "
           "inductor and inductor_loss, for time and for memory separately.", "",
           "| model | dtype | " + " | ".join(m.replace("_", " ") for m in main)
           + " | trainc/best compile ms | trainc/best compile MiB |",
           "|---|---|" + "---|" * (len(main) + 2)]
    ratios: dict[str, list[tuple[float, float]]] = {}
    for name, dt in dict.fromkeys((r["model"], r["dtype"]) for r in rows):
        ratio = ["", ""]
        t, comp = get.get((name, dt, "trainc")), [get.get((name, dt, m)) for m in COMPILED]
        comp = [c for c in comp if c is not None and not c.get("error")]
        if t is not None and not t.get("error") and comp:
            rm = t["step_ms"] / min(c["step_ms"] for c in comp)
            best = min(c["peak_mib"] for c in comp)
            rb = t["peak_mib"] / best if best > 0 else float("nan")
            ratio = [f"{rm:.2f}", f"{rb:.2f}"]
            ratios.setdefault(dt, []).append((rm, rb))
        out.append(f"| {name} | {dt} | " + " | ".join(_cell(get.get((name, dt, m))) for m in main)
                   + f" | {ratio[0]} | {ratio[1]} |")
    out.append("")
    everything = [x for v in ratios.values() for x in v]
    for dt, v in list(ratios.items()) + [("all", everything)]:
        out.append(f"- geomean trainc / best torch.compile ({dt}, {len(v)} models): time "
                   f"{_geo([a for a, _ in v]):.2f}x, peak {_geo([b for _, b in v]):.2f}x")
    for variant in VARIANTS:
        r = [(get[(n, d, variant)]["step_ms"] / min(c["step_ms"] for c in comp))
             for n, d in dict.fromkeys((r["model"], r["dtype"]) for r in rows)
             for comp in [[c for c in (get.get((n, d, m)) for m in COMPILED)
                           if c is not None and not c.get("error")]]
             if comp and not get.get((n, d, variant), {"error": 1}).get("error")]
        if r:
            out.append(f"- geomean {variant} / best torch.compile ({len(r)} rows): "
                       f"time {_geo(r):.2f}x")
    return out


def _budget_rows(rows: list[dict], get: dict) -> list[str]:
    budget = [r for r in rows if r["mode"].endswith("_budget") and not r.get("error")]
    if not budget:
        return []
    out = ["", "Memory budget rows (with the same model's unbudgeted rows):", "",
           "| model | dtype | mode | step ms | peak MiB | first call s |",
           "|---|---|---|---|---|---|"]
    for name, dt in dict.fromkeys((r["model"], r["dtype"]) for r in budget):
        for m in ("inductor", "inductor_loss", "inductor_budget", "trainc", "trainc_budget"):
            r = get.get((name, dt, m))
            if r is not None and not r.get("error"):
                label = m + (f" ({r['budget']})" if r["budget"] is not None else "")
                out.append(f"| {name} | {dt} | {label} | {r['step_ms']} | {r['peak_mib']} "
                           f"| {r['first_call_s']} |")
    return out


def _all_rows(rows: list[dict]) -> list[str]:
    out = ["", "All rows (loss: the last timed step's; modes of one model ran the same steps):",
           "", "| model | dtype | mode | step ms | peak MiB | first call s | loss |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("error"):
            out.append(f"| {r['model']} | {r['dtype']} | {r['mode']} | error: "
                       f"{r['error'][:120].replace('|', '/')} | | | |")
        else:
            out.append(f"| {r['model']} | {r['dtype']} | {r['mode']} | {r['step_ms']} | "
                       f"{r['peak_mib']} | {r['first_call_s']} | {r['loss']:.6g} |")
    return out


def write_outputs(rows: list[dict], meta: dict, out: str) -> str:
    try:
        text = markdown(rows, meta["header"])
    except Exception as e:  # the rows (JSON) matter more than the table
        text = f"{meta['header']}\n\n(table failed: {type(e).__name__}: {e})\n"
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "step_suite.md"), "w") as f:
            f.write(text)
        with open(os.path.join(out, "step_suite.json"), "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return text


# -- driver ---------------------------------------------------------------------------------
def shards(work: list[tuple[str, str]], jobs: int) -> list[list[tuple[str, str]]]:
    """Greedy split of (dtype, model) items by rough build time, heaviest first."""
    out: list[list] = [[] for _ in range(jobs)]
    load = [0.0] * jobs
    for item in sorted(work, key=lambda it: -WEIGHT.get(it[1], 1.0)):
        k = load.index(min(load))
        out[k].append(item)
        load[k] += WEIGHT.get(item[1], 1.0)
    return [s for s in out if s]


def run_items(items, args, device: str, lock, deadline: float, sink) -> list[dict]:
    rows: list[dict] = []
    for dt, name in items:
        dtype = getattr(torch, dt)
        if deadline and time.time() > deadline:
            rows += [_row(name, dtype, m, args, error="skipped: --max-minutes reached")
                     for m in modes_for(name, args)]
        else:
            rows += run_model(name, dtype, args, device, lock)
        sink(rows)
    return rows


def worker(args, device: str) -> None:
    items = [tuple(it.split(":")) for it in args.worker.split(",")]

    def sink(rows):
        with open(args.rows_file, "w") as f:
            json.dump(rows, f)
    run_items(items, args, device, _FileLock(args.lock), args.deadline, sink)


def parent(args, device: str, meta: dict, work) -> list[dict]:
    parts = shards(work, args.jobs)
    own_gpu = device == "cuda" and torch.cuda.device_count() >= len(parts)
    os.makedirs(args.out, exist_ok=True)
    lock = "" if own_gpu else os.path.join(args.out, ".device.lock")
    procs, files = [], []
    for k, part in enumerate(parts):
        files.append(os.path.join(args.out, f".rows_{k}.json"))
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--worker",
               ",".join(f"{dt}:{n}" for dt, n in part), "--rows-file", files[-1],
               "--lock", lock, "--deadline", str(args.deadline)]
        env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": str(k)} if own_gpu else {}))
        procs.append(subprocess.Popen(cmd, env=env))
    rows: list[dict] = []
    while True:
        done = all(p.poll() is not None for p in procs)
        rows = []
        for f in files:
            if os.path.exists(f):
                with contextlib.suppress(ValueError, OSError):
                    rows += json.load(open(f))
        write_outputs(rows, meta, args.out)
        if done:
            return rows
        time.sleep(5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", default="cpu", help="cpu | gpu | tiny")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--modes", default=",".join(m for m in MODES if m not in VARIANTS))
    ap.add_argument("--backend", default="auto", help="trainc backend")
    ap.add_argument("--budget", type=float, default=0.0,
                    help="memory budget of the *_budget modes (trainc memory_budget and "
                         "PyTorch's activation_memory_budget), a fraction in [0, 1]")
    ap.add_argument("--budget-models", default="gpt", help="models that get the *_budget modes")
    ap.add_argument("--device", default="", help="default: cuda for --scale gpu, else cpu")
    ap.add_argument("--out", default="", help="folder for step_suite.md and step_suite.json")
    ap.add_argument("--jobs", type=int, default=1, help="processes (shards of dtype x model)")
    ap.add_argument("--max-minutes", type=float, default=0.0,
                    help="start no new model after this many minutes (0: no limit)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads (CPU; 1 avoids OpenMP thrashing on a busy box)")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--rows-file", default="", help=argparse.SUPPRESS)
    ap.add_argument("--lock", default="", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.modes = args.modes.split(",")
    args.budget_models = args.budget_models.split(",")
    unknown = sorted(set(args.modes) - set(MODES))
    if unknown:
        ap.error(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    if args.jobs > 1 and not args.out:
        ap.error("--jobs needs --out (the shards write their rows there)")
    if args.scale == "tiny":
        models.SIZES = {n: (TINY[n], TINY[n]) for n in models.SIZES}
    device = args.device or ("cuda" if args.scale == "gpu" else "cpu")
    if args.worker:
        return worker(args, device)
    t0 = time.time()
    args.deadline = t0 + 60 * args.max_minutes if args.max_minutes else 0.0
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    header = (f"torch {torch.__version__}, {gpu}, scale {args.scale}, iters {args.iters}, trainc "
              f"backend {args.backend}, {args.jobs} job(s), {torch.get_num_threads()} threads"
              + ("; shared CPU box: timings are noisy" if device == "cpu" else ""))
    meta = dict(header=header, argv=sys.argv[1:], started=time.strftime("%Y-%m-%d %H:%M:%S"))
    print("# " + header, flush=True)
    work = [(dt, n) for dt in args.dtypes.split(",") for n in args.names or models.NAMES]
    if args.jobs > 1:
        rows = parent(args, device, meta, work)
    else:
        rows = run_items(work, args, device, contextlib.nullcontext(), args.deadline,
                         lambda rows: write_outputs(rows, meta, args.out))
    meta["wall_s"] = round(time.time() - t0, 1)
    print("\n" + write_outputs(rows, meta, args.out) + f"\nwall {meta['wall_s']} s")


if __name__ == "__main__":
    main()
