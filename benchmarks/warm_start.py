"""Warm vs cold first call of trainc (the artifact cache), each in a fresh process.

    python benchmarks/warm_start.py [--backend cpp] [--reps 2] [names...]
    WARM_DEVICE=cuda python benchmarks/warm_start.py --backend triton gpt   (on a GPU)

Models: "tiny_mlp" (Linear-GELU-Linear, 64 wide) and the shared suite's (benchmarks/suite_models:
mlp, gpt, convnet, ...). Per model, one process each for: the eager first step and its median
step; Dynamo's own first call (torch.compile with a backend that runs the captured graph as is:
capture + eager run); trainc's first call with an empty cache directory (cold) and then with
the one the cold run filled (warm, --reps times). A first call is from just before
`trainc.compile` to the end of the first forward + backward (`import torch, trainc` excluded:
the last column is what `import trainc` took in the warm process); "load s" is what the cache
hits took inside it (GraphRecord.compile_seconds).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "suite_models")


DEVICE = os.environ.get("WARM_DEVICE", "cpu")  # cuda: the shared suite at its gpu scale, bf16


def _build(name: str):
    import torch
    if name == "tiny_mlp":
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
        x = torch.randn(32, 64)
        return m.to(DEVICE), (x.to(DEVICE),), lambda out, inputs: out.square().mean()
    sys.path.insert(0, os.path.abspath(BENCH))
    import models
    if DEVICE == "cuda":
        return models.build(name, "cuda", "gpu", torch.bfloat16)
    return models.build(name)


def child(name: str, mode: str, backend: str) -> dict:
    import torch
    t = time.perf_counter()
    import trainc
    from trainc import records
    import_s = time.perf_counter() - t
    model, inputs, loss_fn = _build(name)

    def step(f):
        loss = loss_fn(f(*inputs), inputs)
        loss.backward()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return loss

    t0 = time.perf_counter()
    if mode == "eager":
        step(model)
        first = time.perf_counter() - t0
        times = []
        for _ in range(5):
            t = time.perf_counter()
            step(model)
            times.append(time.perf_counter() - t)
        return {"first_s": first, "step_s": statistics.median(times)}
    if mode == "dynamo":
        f = torch.compile(model, backend=lambda gm, example: gm.forward, dynamic=False)
        step(f)
        return {"first_s": time.perf_counter() - t0}
    with records.recording() as recs:
        f = trainc.compile(model, backend=backend)
        step(f)
    first = time.perf_counter() - t0
    return {"first_s": first, "load_s": sum(r.compile_seconds for r in recs), "import_s": import_s,
            "cache": [r.cache.split(";")[0] for r in recs]}


def _spawn(name: str, mode: str, backend: str, cache: str) -> dict:
    env = dict(os.environ, TRAINC_CACHE_DIR=cache, TRAINC_CACHE_ARTIFACTS="1")
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--backend", backend, name],
                         env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{name} {mode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=["tiny_mlp", "mlp", "gpt"])
    ap.add_argument("--backend", default="cpp")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.names[0], a.child, a.backend)))
        return
    print("| model | eager first s | eager step ms | dynamo first s | cold s | warm s | "
          "warm/cold | warm/(eager step + dynamo) | warm load s | warm graphs | import trainc s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in a.names:
        with tempfile.TemporaryDirectory() as cache:
            eager = _spawn(name, "eager", a.backend, cache)
            dyn = _spawn(name, "dynamo", a.backend, cache)
            cold = _spawn(name, "trainc", a.backend, cache)
            warms = [_spawn(name, "trainc", a.backend, cache) for _ in range(a.reps)]
        warm = min(warms, key=lambda w: w["first_s"])
        base = eager["step_s"] + dyn["first_s"]
        reps = ", ".join(f"{w['first_s']:.3f}" for w in warms)
        print(f"| {name} | {eager['first_s']:.3f} | {eager['step_s'] * 1e3:.1f} | "
              f"{dyn['first_s']:.3f} | {cold['first_s']:.3f} | {warm['first_s']:.3f} "
              f"(of {reps}) | "
              f"{warm['first_s'] / cold['first_s']:.2f} | {warm['first_s'] / base:.2f} | "
              f"{warm['load_s']:.3f} | {' '.join(warm['cache'])} | {warm['import_s']:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
