"""Command line: `python -m trainc report <suite model | zoo:NAME | module:callable> [--device cuda]
[--dtype bfloat16] [--budgets none 1.0 0.5 0.0] [--torch-budgets 1.0 0.0] [--out DIR]` (a callable
returns (model, inputs, loss_fn); zoo:NAME is a benchmarks/zoo model, real scale on cuda), and
`python -m trainc bench [zoo options]` (the model zoo of a source checkout: benchmarks/zoo), and
`python -m trainc debug DIR` (an index of a TRAINC_DEBUG_DIR dump)."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Optional, Sequence, Union

import torch

SUITE = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "suite_models", "models.py")
BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


def bench(argv: Sequence[str]) -> int:
    """The zoo benchmark (benchmarks/zoo/run.py); it lives in the source tree, not the package."""
    if not os.path.exists(os.path.join(BENCHMARKS, "zoo", "run.py")):
        raise SystemExit(f"trainc bench: no zoo at {os.path.abspath(BENCHMARKS)}/zoo; it runs "
                         "from a source checkout installed with pip install -e '.[zoo]'")
    sys.path.insert(0, os.path.abspath(BENCHMARKS))
    from zoo import run
    run.main(list(argv))
    return 0


def parse_budget(text: str) -> Optional[Union[float, int]]:
    """'none' -> None; '0.5' (has a dot or exponent) -> fraction; '1000000' -> bytes."""
    if text.lower() == "none":
        return None
    if any(c in text for c in ".eE"):
        return float(text)
    return int(text)


class _ZooStep(torch.nn.Module):
    """A zoo model called with its batch's tensors in order, returning its own loss."""

    def __init__(self, model: torch.nn.Module, keys: Sequence[str]):
        super().__init__()
        self.model, self.keys = model, tuple(keys)

    def forward(self, *tensors):
        return self.model(**dict(zip(self.keys, tensors))).loss


def zoo_workload(name: str, device: str, dtype: torch.dtype):
    """(model, inputs, loss_fn) of a benchmarks/zoo model: real scale on cuda, tiny elsewhere."""
    if not os.path.exists(os.path.join(BENCHMARKS, "zoo", "models.py")):
        raise SystemExit(f"trainc report: no zoo at {os.path.abspath(BENCHMARKS)}/zoo; zoo:NAME "
                         "runs from a source checkout installed with pip install -e '.[zoo]'")
    sys.path.insert(0, os.path.abspath(BENCHMARKS))
    from zoo import models
    try:
        case = models.build(name, "real" if device == "cuda" else "tiny", device, dtype)
    except ValueError as e:
        raise SystemExit(f"trainc report: {e}") from None
    keys = list(case.batch)
    return _ZooStep(case.model, keys), tuple(case.batch[k] for k in keys), lambda out, _: out


def load_workload(spec: str, device: str, suite: str, dtype: torch.dtype = torch.float32):
    if spec.startswith("zoo:"):
        return zoo_workload(spec[4:], device, dtype)
    if ":" in spec:
        module, attr = spec.split(":", 1)
        factory = getattr(importlib.import_module(module), attr)
        try:
            return factory(device=device)
        except TypeError:
            return factory()
    if not os.path.exists(suite):
        raise SystemExit(f"trainc report: no suite at {suite}; pass --suite or module:callable")
    spec_ = importlib.util.spec_from_file_location("trainc_bench_models", suite)
    models = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(models)
    if spec not in models.NAMES:
        raise SystemExit(f"trainc report: unknown suite model {spec!r}; known: {models.NAMES}")
    return models.build(spec, device=device, scale="gpu" if device == "cuda" else "cpu")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return bench(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m trainc")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("bench", help="the model-zoo benchmark (--help for its options)")
    dbg = sub.add_parser("debug", help="index of a TRAINC_DEBUG_DIR dump")
    dbg.add_argument("dir", help="the TRAINC_DEBUG_DIR directory")
    rep = sub.add_parser("report", help="memory / recompute trade-off report")
    rep.add_argument("workload", help="suite model name or module:callable")
    rep.add_argument("--device", default="cpu")
    rep.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                     help="zoo:NAME models only")
    rep.add_argument("--budgets", nargs="+", default=["none", "1.0", "0.75", "0.5", "0.25",
                                                      "0.1", "0.0"])
    rep.add_argument("--torch-budgets", nargs="*", default=None, type=float,
                     help="torch.compile at these activation_memory_budget values beside "
                          "trainc's (default on cuda: 1.0 0.5 0.0; on cpu: none; the bare flag: none)")
    rep.add_argument("--out", default="trainc_report")
    rep.add_argument("--steps", type=int, default=5)
    rep.add_argument("--backend", default="auto")
    rep.add_argument("--offload", action="store_true",
                     help="budgets may move saved activations to host memory (Config.offload)")
    rep.add_argument("--suite", default=SUITE, help="path of the suite models.py")
    args = ap.parse_args(argv)
    if args.cmd == "debug":
        from trainc.debug_index import index
        print(index(args.dir))
        return 0
    from trainc import report
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("trainc report: --device cuda but CUDA is not available")
    model, inputs, loss_fn = load_workload(args.workload, args.device, args.suite,
                                           getattr(torch, args.dtype))
    budgets = [parse_budget(b) for b in args.budgets]
    name = args.workload.replace(":", "_").replace(".", "_")
    torch_budgets = args.torch_budgets if args.torch_budgets is not None else \
        (1.0, 0.5, 0.0) if args.device == "cuda" else ()
    result = report.tradeoff(model, inputs, loss_fn, budgets, name=name, steps=args.steps,
                             out_dir=args.out, backend=args.backend, torch_budgets=torch_budgets,
                             **({"offload": True} if args.offload else {}))
    print(result.table())
    print(f"wrote {args.out}/{name}_tradeoff.csv, .json, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
