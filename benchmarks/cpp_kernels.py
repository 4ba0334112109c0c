"""Time each generated C++ kernel of one training step alone (warm caches, median of 300 calls),
optionally against an edited copy of the forward or backward C++ source:

    python benchmarks/cpp_kernels.py convnet [--objective bytes] [--alt bwd edited.cpp]

The step runs once with every kernel call recorded (its ctypes function and pointer arguments;
the buffers stay alive), then each call is replayed. Dump the sources to edit with
TRAINC_DEBUG_DIR=d (30_fwd_wrapper.py / 31_bwd_wrapper.py end with CPP_SOURCE).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for _bench in (os.path.join(HERE, "suite_models"),):
    if os.path.isdir(_bench):
        sys.path.insert(0, os.path.abspath(_bench))
import models  # noqa: E402

import trainc  # noqa: E402
import trainc.codegen.wrapper as W  # noqa: E402


class _Keep:
    """torch as the wrapper sees it, keeping every buffer it allocates alive."""

    def __init__(self, keep: list):
        self._keep = keep

    def __getattr__(self, name):
        real = getattr(torch, name)
        if name not in ("empty", "empty_strided"):
            return real

        def alloc(*a, **k):
            t = real(*a, **k)
            self._keep.append(t)
            return t
        return alloc


def record_calls(name: str, objective):
    """[(graph "f"/"b"/"a", kernel name, ctypes function, args)] of one step, buffers kept."""
    keep, calls, built, recording = [], [], [], [False]
    build = W.Wrapper.build

    def recording_build(self, kernels):
        run = build(self, kernels)
        kernels.load()  # built in the background: its functions are attributes from here on
        graph = "fba"[min(len(built), 2)]  # forward, backward, accumulating backward
        built.append(graph)
        ns = run.__globals__
        ns["torch"] = _Keep(keep)
        for k, v in list(ns.items()):
            if k.startswith("op_") and callable(v):
                ns[k] = lambda *a, _v=v, **kw: keep.append(_v(*a, **kw)) or keep[-1]

        class Recorder:
            pass
        rec = Recorder()
        for n in dir(kernels):
            if n.startswith("kernel"):
                f = getattr(kernels, n)

                def call(*a, _f=f, _n=n, _g=graph):
                    if recording[0]:
                        calls.append((_g, _n, _f, a))
                    _f(*a)
                setattr(rec, n, call)
        ns["K"] = rec

        def run_keeping_args(args, _run=run):
            keep.append(list(args))
            return _run(args)
        return run_keeping_args

    W.Wrapper.build = recording_build
    try:
        m, x, loss = models.build(name, "cpu", "cpu", torch.float32)
        f = trainc.compile(m, backend="cpp", partition_objective=objective, cache_artifacts=False)

        def step():
            xs = tuple(t.detach().requires_grad_(t.requires_grad) for t in x)
            keep.append(xs)
            models.step(f, xs, loss)
        for _ in range(3):
            step()
        recording[0] = True
        step()
    finally:
        W.Wrapper.build = build
    return calls, keep


def median_us(fn, args, n: int = 300) -> float:
    for _ in range(10):
        fn(*args)
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn(*args)
        ts.append(time.perf_counter() - t)
    return sorted(ts)[n // 2] * 1e6


def load_alt(path: str) -> ctypes.CDLL:
    so = path[:-4] + ".so"
    subprocess.check_call([trainc.config.Config.cpp_compiler,
                           *trainc.config.Config.cpp_flags.split(), "-shared", "-fPIC",
                           "-o", so, path])
    return ctypes.CDLL(so)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--objective", default=None, help="partition objective (default: as is)")
    ap.add_argument("--alt", nargs=2, metavar=("GRAPH", "CPP"), help="fwd|bwd and a C++ file")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    calls, _keep = record_calls(a.model, a.objective)
    alt = (a.alt[0][0], load_alt(a.alt[1])) if a.alt else None
    total: dict[str, float] = {}
    for graph, name, fn, args in calls:
        us = median_us(fn, args)
        total[graph] = total.get(graph, 0.0) + us
        line = f"{graph}:{name:10s} {us:8.2f} us"
        if alt and alt[0] == graph:
            other = getattr(alt[1], name)
            other.argtypes, other.restype = fn.argtypes, None
            us2 = median_us(other, args)
            total[graph + " alt"] = total.get(graph + " alt", 0.0) + us2
            line += f"   alt {us2:8.2f} us"
        print(line)
    print("total us:", {k: round(v, 1) for k, v in total.items()})


if __name__ == "__main__":
    main()
