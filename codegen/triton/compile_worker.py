"""Triton compile workers, started by compile_pool.py as a script: it imports torch and Triton
only. Started as `-m trainc.codegen.triton.compile_pool` it imported the trainc package too
(sympy, networkx, ...): ~4 s more per process on the H200 host, before its first compile.

`compile_worker.py R0,W0 R1,W1 ...`: one process imports torch and Triton, then forks a
worker per pair of pipe descriptors (jobs in on R, answers out on W): sixteen processes
importing torch at once took 5.3 s each on the H200 host, one takes ~4.5 s. Without
arguments it is one worker on stdin/stdout. A worker reads job specs (compile_pool.job_spec,
one JSON list per line) and answers each, in order, with "ok" or "failed <error>"; it exits
at end of input.
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
        module = importlib.util.module_from_spec(s)
        s.loader.exec_module(module)
        modules[path] = module
    kernel = getattr(modules[path], name).warmup(*(getattr(torch, d) for d in dtypes),
                                                 grid=(1,), **meta)
    try:  # also its C launcher (cached on disk per signature, ~0.3 s of gcc each); not
        # _init_handles, which would load the module onto the GPU
        from triton.runtime import driver
        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception:  # noqa: BLE001 (optional: the first launch builds what is missing)
        pass


def serve(jobs, answers) -> None:
    modules: dict = {}
    for line in jobs:  # one job per line until the lead closes the pipe
        try:
            compile_job(json.loads(line), modules)
            answers.write("ok\n")
        except Exception as e:  # noqa: BLE001 (the in-process compile reports real errors)
            message = str(e).strip().splitlines()[:1]
            answers.write(f"failed {type(e).__name__}: {''.join(message)[:300]}\n")
        answers.flush()


def fork_workers(pairs: list[tuple[int, int]]) -> None:
    """Fork a worker per pair. Nothing before the fork may touch the GPU (Triton's driver
    asks CUDA for its devices): a forked child cannot use a CUDA its parent initialized."""
    children = []
    for i, (r, w) in enumerate(pairs):
        pid = os.fork()
        if pid == 0:
            try:
                for j, fds in enumerate(pairs):
                    if j != i:
                        for fd in fds:
                            os.close(fd)
                with open(r) as jobs, open(w, "w") as answers:
                    serve(jobs, answers)
            finally:
                os._exit(0)
        children.append(pid)
    for r, w in pairs:  # only the children hold them now: a child's exit ends its answers
        os.close(r)
        os.close(w)
    for pid in children:
        os.waitpid(pid, 0)


def main() -> None:
    if len(sys.argv) > 1:
        fork_workers([tuple(int(x) for x in a.split(",")) for a in sys.argv[1:]])
    else:
        serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
