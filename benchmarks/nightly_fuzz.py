"""The nightly fuzz split over processes: every fuzz property x backend x budget, seeded.

    python benchmarks/nightly_fuzz.py [--jobs 16] [--seed 20261130] [--examples 300]
                                      [--backends aten,cpp,triton] [--repeat triton=4]
                                      [--minutes 9] [--out DIR] [--shrink]

Each job is one pytest run of tests/fuzz under the nightly profile with its own seed;
TRAINC_FUZZ_EXAMPLES sets the profile's count (the properties scale it per backend). Prints
per backend: programs checked (pass / refused as unsupported), failures, and the seeds used.
A job whose process crashed (CRASHED) leaves the program it was checking in <job>.current.py.
"""
from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = {"programs": "test_programs.py::test_programs_match_eager",
         "programs_nodrop": "test_programs.py::test_programs_without_dropout_match_eager",
         "modules": "test_modules.py::test_module_stacks_match_eager",
         "zoo": "test_modules.py::test_zoo_stacks_match_eager",
         "dropout": "test_dropout.py::test_dropout_backward_uses_forward_mask"}
BUDGETS = ("None", "0.5", "0.0")


def main() -> None:
    args = _parse()
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    repeat = {k: int(v) for k, v in (kv.split("=") for kv in args.repeat.split(",") if kv)}
    jobs = [(t, b, g) for t, b, g in itertools.product(args.tests.split(","),
                                                       args.backends.split(","), BUDGETS)
            for _ in range(repeat.get(b, 1))]
    t0 = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:
        done = list(pool.map(lambda ij: _run(ij[0], ij[1], args), enumerate(jobs)))
    print(f"\n{len(jobs)} jobs, {time.time() - t0:.0f} s wall, base seed {args.seed}")
    per_backend: dict[str, Counter] = {}
    for (test, backend, budget), (rc, tally, log) in zip(jobs, done):
        c = per_backend.setdefault(backend, Counter())
        c.update(tally)
        status = "ok" if rc == 0 else ("TIMEOUT" if rc in (124, -9) else
                                       "CRASHED" if _crashed(log) else "FAILED")
        print(f"{test:16s} {backend:7s} {budget:5s} {status:8s} {dict(tally)}  log {log}")
    for backend, c in per_backend.items():
        checked = sum(c.values())
        print(f"{backend}: {checked} programs checked: " + ", ".join(f"{k} {v}" for k, v in
                                                                     c.most_common()))


def _run(i: int, job: tuple, args) -> tuple[int, Counter, str]:
    test, backend, budget = job
    seed = args.seed + i
    name = f"{test}-{backend}-{budget}-{seed}"
    log, tally, current = (os.path.join(args.out, f"{name}.{ext}")
                           for ext in ("log", "tally", "current.py"))
    env = dict(os.environ, TRAINC_FUZZ_EXAMPLES=str(args.examples), TRAINC_FUZZ_TALLY=tally,
               TRAINC_FUZZ_CURRENT=current,
               TRAINC_FUZZ_SHRINK="1" if args.shrink else "0",
               OMP_NUM_THREADS="1", TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    if os.path.exists(tally):
        os.remove(tally)
    cmd = ["timeout", str(int(args.minutes * 60)), sys.executable, "-m", "pytest", "-q", "-x",
           "-p", "no:cacheprovider", "-W", "ignore", "--hypothesis-profile=nightly",
           f"--hypothesis-seed={seed}",
           os.path.join(ROOT, "tests", "fuzz", f"{TESTS[test]}[{backend}-{budget}]")]
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        # Not from the repo root: its trainc/ would shadow the installed package mapping.
        rc = subprocess.call(cmd, cwd=args.out, env=env, stdout=f, stderr=subprocess.STDOUT)
    lines = open(tally).read().split() if os.path.exists(tally) else []
    return rc, Counter(lines), log


def _crashed(log: str) -> bool:
    """The process died (segfault/abort): the program it ran is in <job>.current.py."""
    with open(log, errors="replace") as f:
        return "Fatal Python error" in f.read()


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--examples", type=int, default=300, help="nightly profile max_examples")
    p.add_argument("--backends", default="aten,cpp,triton")
    p.add_argument("--repeat", default="", help="jobs per combination by backend: cpp=2,triton=4")
    p.add_argument("--tests", default="programs,programs_nodrop")
    p.add_argument("--minutes", type=float, default=9.0, help="per-job limit")
    p.add_argument("--out", default="fuzz_out")
    p.add_argument("--shrink", action="store_true", help="shrink failures (can take minutes)")
    return p.parse_args()


if __name__ == "__main__":
    main()
