"""Shared by the fuzz tests: the (backend, memory budget) matrix and the unsupported filter."""
from __future__ import annotations

import os
import traceback

import pytest
import torch
from hypothesis import event, settings

import trainc
from trainc.codegen import BACKENDS
from trainc.testing import UnreplayableDropout

BUDGETS = (None, 0.5, 0.0)
# Per-example cost relative to the aten backend: generated-code backends compile C++/Triton.
COST = {"aten": 1, "cpp": 3, "triton": 3}


def backends() -> list[str]:
    names = [b for b in BACKENDS if b != "triton"]
    if "triton" in BACKENDS and os.environ.get("TRITON_INTERPRET") == "1":
        names.append("triton")
    return names


def _probe(backend: str, budget) -> str | None:
    """None if a tiny training graph compiles with these options, else why it cannot."""
    try:
        f = trainc.compile(lambda x: (x * 2).sin(), backend=backend, memory_budget=budget)
        f(torch.randn(3, requires_grad=True)).sum().backward()
    except NotImplementedError as e:
        return str(e).splitlines()[0]
    finally:
        torch._dynamo.reset()
    return None


def combos() -> list:
    """pytest params over every backend x budget; ones trainc refuses today are skipped with
    its reason, so they start running on their own once the feature lands."""
    out = []
    for backend in backends():
        for budget in BUDGETS:
            why = _probe(backend, budget)
            marks = [pytest.mark.skip(reason=why)] if why else []
            out.append(pytest.param(backend, budget, marks=marks, id=f"{backend}-{budget}"))
    return out


def examples(backend: str, scale: float = 1.0, budget=None) -> int:
    """This profile's example count, divided by the backend's cost (under a memory budget the
    partitioner's search sweeps min-cuts per example: twice the cost on aten)."""
    cost = COST.get(backend, 3) * (2 if budget is not None and backend == "aten" else 1)
    return max(1, int(settings.default.max_examples * scale / cost))


# Open compiler bugs, each with an xfail(strict) test of this name in test_regressions.py. The
# properties record them as hypothesis events rather than failing, so the default suite stays
# green while they are open; delete the entry together with the xfail marker once fixed.
KNOWN_BUGS: dict[str, tuple[type, str, str]] = {  # name: (exception, message part, file)
}


def _known_bug(e: BaseException) -> str | None:
    files = [f.filename for f in traceback.extract_tb(e.__traceback__)]
    for name, (kind, text, where) in KNOWN_BUGS.items():
        if isinstance(e, kind) and text in str(e) and any(where in f for f in files):
            return name
    return None


def run_check(thing, backend: str, budget) -> None:
    """thing.check(...); clear trainc refusals are not bugs: count them and move on."""
    outcome = "fail"
    _note_current(thing, backend, budget)
    try:
        thing.check(backend=backend, memory_budget=budget)
        outcome = "pass"
    except UnreplayableDropout as e:  # a limit of the eager oracle, not of trainc
        outcome = "unreplayable"
        event(f"unreplayable dropout: {e}")
    except trainc.UnsupportedError as e:
        outcome = "unsupported"
        event(f"unsupported: {str(e)[:80]}")
    except (NotImplementedError, ValueError) as e:  # e.g. BudgetError: infeasible budget
        if not str(e).startswith("trainc:"):
            raise
        outcome = "refused"
        event(f"refused: {str(e)[:80]}")
    except Exception as e:  # noqa: BLE001 - re-raised unless it is a known bug
        name = _known_bug(e)
        if name is None:
            raise
        outcome = f"known bug {name}"
        event(f"known bug: {name}")
    finally:
        _tally(outcome)


def _note_current(thing, backend: str, budget) -> None:
    """The example about to run, as a findings-style program file, to $TRAINC_FUZZ_CURRENT:
    a crash (segfault) kills the process before hypothesis can print it."""
    path = os.environ.get("TRAINC_FUZZ_CURRENT")
    source = getattr(thing, "source", None)
    if path and source:
        with open(path, "w") as f:
            f.write(f"{source}\n\nOPTS = {{'backend': {backend!r}, 'memory_budget': {budget!r}}}\n")


def _tally(outcome: str) -> None:
    """One line per checked example to $TRAINC_FUZZ_TALLY (benchmarks/nightly_fuzz.py counts)."""
    path = os.environ.get("TRAINC_FUZZ_TALLY")
    if path:
        with open(path, "a") as f:
            f.write(outcome + "\n")
