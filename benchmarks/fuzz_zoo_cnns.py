"""Judge the zoo's CNNs with trainc.testing (issue 14 item 5): one float32 training step of each
tiny CNN (random init, the model's own loss), loss, parameter gradients and BatchNorm buffers
against float64 under assert_grads_match: the conditioning estimate, eager variants
(channels-last, one thread) and boundary flips. Prints one verdict per model with its reason.

    python benchmarks/fuzz_zoo_cnns.py [--backend cpp] [--models resnet,mobilenet_v2]
                                       [--plain] [--float-accumulators]

--plain also prints what the one-eager-run policy (zoo/run.py's accuracy) says, so a pass shows
which relaxation admitted it; --float-accumulators builds cpp sums with float accumulators (the
code before finding zoo_cpp_None_34102_69's fix) to show that fix's part.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zoo import models  # noqa: E402
from zoo.run import accuracy  # noqa: E402

from trainc.testing import assert_grads_match  # noqa: E402

CNNS = [e.name for e in models.ENTRIES if e.family == "cnn"]


class LossOf(torch.nn.Module):
    """A zoo model as assert_grads_match wants it: positional inputs, a tuple of outputs."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values, labels):
        return (self.model(pixel_values=pixel_values, labels=labels).loss,)


def judge(name: str, backend: str) -> tuple[str, str]:
    """(verdict, reason) for one model."""
    case = models.build(name, "tiny")
    batch = [case.batch["pixel_values"], case.batch["labels"]]
    try:
        notes = assert_grads_match(LossOf(case.model), batch, backend=backend)
    except AssertionError as e:
        lines = [ln.strip() for ln in str(e).splitlines()[1:] if ln.startswith("  ")]
        return "fail", "; ".join(lines[:4]) + (f" (+{len(lines) - 4} more)" if len(lines) > 4
                                                else "")
    if not notes:
        return "pass", "every value within k * eager (or the conditioning estimate)"
    return "pass", "; ".join(str(n) for n in notes[:4])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpp")
    ap.add_argument("--models", default=",".join(CNNS))
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--float-accumulators", action="store_true")
    a = ap.parse_args()
    if a.float_accumulators:
        from trainc.codegen.cpp import exprs, reductions
        reductions.acc_ctype = lambda op, dtype: exprs.ctype(dtype)
    for name in a.models.split(","):
        t0 = time.time()
        verdict, reason = judge(name, a.backend)
        plain = ""
        if a.plain:
            r = accuracy(name, "tiny", "cpu", torch.float32, a.backend)
            plain = f" | one-eager policy: {r['accuracy']} {'; '.join(r['mismatches'][:3])}"
        print(f"| {name} | {a.backend} | {verdict} | {time.time() - t0:.0f} s | {reason}{plain} |",
              flush=True)


if __name__ == "__main__":
    main()
