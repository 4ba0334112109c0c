"""A Triton compile worker, started by compile_pool.py as a script: it imports torch and Triton
only. Started as `-m trainc.codegen.triton.compile_pool` it imported the trainc package too
(sympy, networkx, ...): ~4 s more per process on the H200 host, before its first compile.

Reads job specs (compile_pool.job_spec, one JSON list per line) on stdin and answers each, in
order, with "ok" or "failed <error>" on stdout; exits at end of input.
"""
import os
import sys

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this folder's modules (launch, printer, ...) must not shadow others

import importlib.util  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402  (imported before the first job arrives: the lead is tracing)
import triton  # noqa: E402, F401


def compile_job(spec: list, modules: dict) -> None:
    path, name, dtypes, meta = spec
    if path not in modules:
        s = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
        modules[path] = importlib.util.module_from_spec(s)
        s.loader.exec_module(modules[path])
    kernel = getattr(modules[path], name).warmup(*(getattr(torch, d) for d in dtypes),
                                                 grid=(1,), **meta)
    try:  # also its C launcher (cached on disk per signature, ~0.3 s of gcc each); not
        # _init_handles, which would load the module onto the GPU
        from triton.runtime import driver
        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 (optional: the first launch builds what is missing)
        pass


def main() -> None:
    modules: dict = {}
    for line in sys.stdin:  # one job per line until the lead closes the pipe
        try:
            compile_job(json.loads(line), modules)
            print("ok", flush=True)
        except Exception as e:  # noqa: BLE001 (the in-process compile reports real errors)
            print("failed", type(e).__name__, flush=True)


if __name__ == "__main__":
    main()
