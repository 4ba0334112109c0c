"""Fuzz that keeps going after a failure and writes each failing example as a finding file.

    python benchmarks/fuzz_collect.py KIND BACKEND BUDGET N SEED OUTDIR [MINUTES]

KIND: programs, nodrop (no dropout, 12 ops), modules, zoo, held (float32 programs drawn only
from the op families of issue 34's held-out failures). Each failure or crash becomes
OUTDIR/<kind>_<backend>_<budget>_<seed>_<i>.py in tests/fuzz/findings' format (program or
module source, OPTS), with the report appended as a string. One process; prints a tally.
"""
import collections
import os
import sys
import time
import traceback
import warnings

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed

import trainc
from trainc.testing import UnreplayableDropout, module_stacks, programs, zoo_stacks
from trainc.testing import compositions as C
from trainc.testing import ops as O

os.environ.setdefault("TRAINC_CACHE_ARTIFACTS", "0")
warnings.simplefilter("ignore")


def strategy(kind: str):
    held = [C.softmax_chain, C.norm, C.batched_matmul, C.pair, C.reduce_twice, C.kinked,
            C.view_between, O.unary, O.binary, O.reduction, O.matmul, O.view]
    return {"programs": programs(), "nodrop": programs(dropout=False, max_ops=12),
            "modules": module_stacks(), "zoo": zoo_stacks(),
            "held": programs(dropout=False, max_ops=16, dtypes=(torch.float32,),
                             families=held)}[kind]


def check_one(thing, backend: str, budget) -> tuple[str, str]:
    """(outcome, report) as tests/fuzz/fuzz_helpers.run_check classifies them."""
    try:
        thing.check(backend=backend, memory_budget=budget)
        return "pass", ""
    except UnreplayableDropout:
        return "unreplayable", ""
    except trainc.UnsupportedError:
        return "unsupported", ""
    except AssertionError as e:
        return "fail", str(e)
    except Exception as e:  # noqa: BLE001 - a crash is a finding too
        if isinstance(e, (NotImplementedError, ValueError)) and str(e).startswith("trainc:"):
            return "refused", ""
        return "error", traceback.format_exc()


def write_finding(path: str, thing, backend: str, budget, report: str) -> None:
    quote = '"' * 3
    with open(path, "w") as f:
        f.write(thing.source + f"\n\nOPTS = {{'backend': {backend!r}, "
                f"'memory_budget': {budget!r}}}\n")
        f.write(quote + "\n" + report.replace(quote, "'''")[:3000] + "\n" + quote + "\n")


def main() -> None:
    kind, backend, budget = sys.argv[1], sys.argv[2], eval(sys.argv[3])
    n, sd, out = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
    minutes = float(sys.argv[7]) if len(sys.argv) > 7 else 1e9
    torch.set_num_threads(1)
    os.makedirs(out, exist_ok=True)
    tally, t0, count = collections.Counter(), time.time(), [0]

    @hseed(sd)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy(kind))
    def prop(thing):
        if time.time() - t0 > minutes * 60:
            return
        count[0] += 1
        outcome, report = check_one(thing, backend, budget)
        tally[outcome] += 1
        if count[0] % 25 == 0:
            print("progress", count[0], dict(tally), f"{time.time() - t0:.0f}s", flush=True)
        if outcome in ("fail", "error"):
            name = f"{kind}_{backend}_{budget}_{sd}_{count[0]}"
            write_finding(os.path.join(out, name + ".py"), thing, backend, budget, report)
            print("FAIL", name, report.splitlines()[1:3], flush=True)
    prop()
    print(kind, backend, budget, "seed", sd, dict(tally), f"{time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
