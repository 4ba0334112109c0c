"""OpInfo sweep: torch's op_db samples for differentiable float32 ops through trainc.compile.

    python benchmarks/opinfo_sweep.py [--backends aten,cpp] [--samples 3] [--ops add,mul]
                                      [--time-limit 1800] [--json out.json] [--shard 0/4]
    python benchmarks/opinfo_sweep.py --summarize shard0.json shard1.json ...

Per op and backend: pass, fallback (correct, but some ATen ops ran without generated code),
fail (a policy mismatch or a crash that is not a clear trainc refusal), or skip with a reason.
"""
from __future__ import annotations

import argparse
import json
import signal
import time
import warnings
from collections import Counter

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import trainc
from trainc.codegen import BACKENDS
from trainc.testing import assert_grads_match

RANDOM_WORDS = ("dropout", "bernoulli", "normal", "rand", "multinomial", "uniform", "cauchy",
                "exponential", "geometric", "log_normal", "poisson", "rrelu")
SAMPLE_SECONDS = 60


def main() -> None:
    args = _parse()
    if args.summarize:  # totals of sharded runs
        results = [r for f in args.summarize for r in json.load(open(f))]
        backends = list(dict.fromkeys(r["backend"] for r in results))
        _summary(results, len(results) // max(len(backends), 1), backends, 0.0)
        return
    from torch.testing._internal.common_methods_invocations import op_db
    backends = args.backends.split(",") if args.backends else [b for b in BACKENDS
                                                                if b != "triton"]
    wanted = set(args.ops.split(",")) if args.ops else None
    ops = [op for op in op_db if wanted is None or op.name in wanted
           or f"{op.name}.{op.variant_test_name}" in wanted]
    k, n = (int(v) for v in args.shard.split("/"))
    ops = ops[k::n]
    t0, results = time.time(), []
    for op in ops:
        if time.time() - t0 > args.time_limit:
            break
        for backend in backends:
            status, detail = sweep_op(op, backend, args.samples)
            results.append({"op": _name(op), "backend": backend, "status": status,
                            "detail": detail})
            print(f"{_name(op):40s} {backend:5s} {status:8s} {detail}", flush=True)
    _summary(results, len(ops), backends, time.time() - t0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def sweep_op(op, backend: str, max_samples: int) -> tuple[str, str]:
    """(status, detail) for one OpInfo on one backend."""
    why = _skip_reason(op)
    if why:
        return "skip", why
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))[:max_samples]
    if not samples:
        return "skip", "no float32 samples"
    fallbacks: set[str] = set()
    for i, sample in enumerate(samples):
        status, detail = _sweep_sample(op, sample, backend, fallbacks)
        if status != "pass":
            return status, f"sample {i}: {detail}"
    if fallbacks and backend != "aten":
        return "fallback", ", ".join(sorted(fallbacks))
    return "pass", f"{len(samples)} samples"


def _sweep_sample(op, sample, backend: str, fallbacks: set) -> tuple[str, str]:
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [i for i, x in enumerate(leaves) if torch.is_tensor(x)]

    def fn(*tensors):
        full = list(leaves)
        for i, t in zip(slots, tensors):
            full[i] = t
        inp, a, kw = tree_unflatten(full, spec)
        return op.op(inp, *a, **kw)

    inputs = [leaves[i] for i in slots]
    if any(t.layout != torch.strided for t in inputs):
        return "skip", "sparse input"
    signal.alarm(SAMPLE_SECONDS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert_grads_match(fn, inputs, source=f"{_name(op)}: {sample}", backend=backend)
            if backend != "aten":
                fallbacks.update(trainc.explain(fn, *inputs, backend=backend).fallback_ops)
        return "pass", ""
    except AssertionError as e:
        return "fail", " | ".join(str(e).splitlines()[1:3])
    except Exception as e:  # noqa: BLE001 - every crash is classified and reported
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
        refused = isinstance(e, trainc.UnsupportedError) or str(e).startswith("trainc:")
        if not refused and _eager_raises(fn, inputs):
            return "skip", f"eager raises too: {msg}"
        return ("skip" if refused else "fail"), msg
    finally:
        signal.alarm(0)
        torch._dynamo.reset()


def _eager_raises(fn, inputs) -> bool:
    """Does eager itself fail on this sample (forward or backward)? Then there is no oracle."""
    try:
        xs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
        outs = [o for o in tree_flatten(fn(*xs))[0] if torch.is_tensor(o) and o.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    except Exception:  # noqa: BLE001 - any eager failure
        return True
    return False


def _skip_reason(op) -> str:
    if not op.supports_autograd:
        return "not differentiable"
    if torch.float32 not in op.supported_dtypes("cpu"):
        return "no float32 on CPU"
    if any(w in op.name for w in RANDOM_WORDS):
        return "random op: no eager reference"
    if "sparse" in op.name:
        return "sparse layout"
    return ""


def _name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _summary(results: list, n_ops: int, backends: list, seconds: float) -> None:
    print(f"\nswept {len(results) // max(len(backends), 1)} of {n_ops} OpInfos in {seconds:.0f} s")
    for backend in backends:
        mine = [r for r in results if r["backend"] == backend]
        counts = Counter(r["status"] for r in mine)
        print(f"{backend}: " + ", ".join(f"{k} {counts[k]}" for k in
                                         ("pass", "fallback", "fail", "skip")))
        fb = Counter(o for r in mine if r["status"] == "fallback" for o in r["detail"].split(", "))
        if fb:
            print("  fallback ops: " + ", ".join(f"{o} ({n})" for o, n in fb.most_common()))
        skips = Counter(r["detail"].split(": ", 1)[-1][:70] if r["detail"].startswith("sample")
                        else r["detail"] for r in mine if r["status"] == "skip")
        print("  skip reasons: " + "; ".join(f"{k} ({n})" for k, n in skips.most_common(8)))


def _timeout(signum, frame):
    raise TimeoutError(f"sample took more than {SAMPLE_SECONDS} s")


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="", help="comma list (default: all but triton)")
    p.add_argument("--samples", type=int, default=3, help="samples per op")
    p.add_argument("--ops", default="", help="comma list of OpInfo names")
    p.add_argument("--time-limit", type=float, default=3600.0, help="stop starting ops after")
    p.add_argument("--json", default="", help="write per-op results here")
    p.add_argument("--shard", default="0/1", help="K/N: sweep every N-th op starting at K")
    p.add_argument("--summarize", nargs="*", default=[], help="print totals of --json files")
    return p.parse_args()


if __name__ == "__main__":
    signal.signal(signal.SIGALRM, _timeout)
    main()
