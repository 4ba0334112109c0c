"""Peak CPU memory of one compiled step (torch.profiler allocator events) on the shared suite at
scale cpu: trainc.compile (loss and backward outside) and trainc.compile_step (AdamW), per
backend; plus whether compile_step kept the parameters' storage.

    python benchmarks/inplace_memory.py [--backends cpp,triton] [--modes compile,step]
        [--no-inplace] [names...]

--no-inplace ignores every storage hint (in-place results get fresh buffers: the behaviour
before codegen/memory/inplace.py), for a before/after comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for bench in (os.path.join(HERE, "suite_models"),):
    if os.path.isdir(bench):
        sys.path.insert(0, bench)

import models  # noqa: E402
import trainc  # noqa: E402
from trainc.report import _peak  # noqa: E402


def _bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def measure(name: str, backend: str, mode: str) -> dict:
    model, inputs, loss = models.build(name)
    params = list(model.parameters())
    if mode == "step":
        opt = torch.optim.AdamW(params, lr=1e-3)
        step = trainc.compile_step(model, lambda m, *xs: loss(m(*xs), xs), opt, backend=backend)
        run = lambda: step(*inputs)
    else:
        fn = trainc.compile(model, backend=backend)

        def run():
            for p in params:
                p.grad = None
            loss(fn(*inputs), inputs).backward()
    run()
    run()  # optimizer state exists and compiles are done
    ptrs = [p.data_ptr() for p in params]
    peak = _peak(run, torch.device("cpu"))
    state = [t for s in getattr(locals().get("opt"), "state", {}).values() for t in s.values()
             if isinstance(t, torch.Tensor) and t.dim() > 0]
    return {"model": name, "backend": backend, "mode": mode, "peak_MiB": round(peak / 2**20, 2),
            "params_MiB": round(_bytes(params) / 2**20, 2),
            "state_MiB": round(_bytes(state) / 2**20, 2),
            "params_kept": [p.data_ptr() for p in params] == ptrs}


def _ignore_hints() -> None:
    import trainc.codegen.cpp as cpp
    import trainc.codegen.triton as tri

    def none(sched):
        sched.graph.storage = {}
        return {}
    cpp.plan_storage = tri.plan_storage = none


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=list(models.NAMES))
    ap.add_argument("--backends", default="cpp,triton")
    ap.add_argument("--modes", default="compile,step")
    ap.add_argument("--no-inplace", action="store_true")
    a = ap.parse_args()
    if a.no_inplace:
        _ignore_hints()
    for backend in a.backends.split(","):
        if backend == "triton":
            os.environ.setdefault("TRITON_INTERPRET", "1")
        for mode in a.modes.split(","):
            for name in a.names:
                print(json.dumps(measure(name, backend, mode)), flush=True)


if __name__ == "__main__":
    main()
