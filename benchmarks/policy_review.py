"""Review of the correctness policy's relaxations against float64 gradcheck (issue 34 item 6).

    python benchmarks/policy_review.py --programs 200 --seed 3406 --backends cpp,aten \\
        [--max-ops 12] [--out review.jsonl] [--table review.jsonl ...]

Samples programs from trainc.testing.programs (no dropout: gradcheck needs a deterministic
function), compiles each with trainc per backend and judges every compared value as
assert_grads_match does: with all of policy.Relaxations on, with each one switched off alone,
and with all off. A value a relaxation *admitted* passes with all on and fails without it.

Per program, the compiled function is also compiled in float64 and run under
torch.autograd.gradcheck (finite differences of the compiled forward against its compiled
backward), beside eager's float64 gradcheck as the control: a program eager itself fails
(a kink, tie or jump within eps, a huge or tiny scale) is "not differentiable here" and skipped,
as are programs with non-finite values. Then two wrong kernels are planted in trainc's compiled
backward (runtime._grads_by_input): one gradient scaled by 1 + 1e-3, or one element of it moved
by 1e-3 of its norm; each planted program is judged by the policy and by gradcheck again.

--out appends one JSON line per (program, backend); --table prints the tables of such files.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import time
import traceback
import warnings
from typing import Callable, Optional

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed
from torch.utils._pytree import tree_flatten

import trainc
from trainc import runtime
from trainc.testing import programs
from trainc.testing.check import (_clone, _conditioning_parts, _judge, _low_precision_err, _run,
                                  _Runs, _values)
from trainc.testing.policy import ALL_ON, Relaxations, rel_err

RELAXATIONS = [f.name for f in dataclasses.fields(Relaxations)]
CONFIGS = {"all on": ALL_ON, "all off": Relaxations(**{n: False for n in RELAXATIONS})}
CONFIGS.update({n: dataclasses.replace(ALL_ON, **{n: False}) for n in RELAXATIONS})
PLANTS = ("scale", "element")
PARTS = ("rounding_conditioning", "emulated_spread")
# A planted error's relative size: 1e-3 is under half a bfloat16 ulp (3.9e-3), so a bf16
# gradient gets 2e-2 (a few ulps), the smallest size its own dtype can carry reliably.
PLANT_SIZE = {torch.bfloat16: 2e-2, torch.float16: 2e-2}
PLANT_DEFAULT = 1e-3


def plant_size(dtype: torch.dtype) -> float:
    return PLANT_SIZE.get(dtype, PLANT_DEFAULT)


def sample(n: int, seed: int, max_ops: int) -> list:
    """n programs, the same for a given (n, seed, max_ops) and hypothesis version."""
    out: list = []

    @hseed(seed)
    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(programs(dropout=False, max_ops=max_ops))
    def draw(prog):
        out.append(prog)
    draw()
    return out


class _CachedRuns(_Runs):
    """check._Runs whose eager variants and flip runs are made once per program: the review
    judges the same values under a dozen Relaxations."""

    def __init__(self, *args):
        super().__init__(*args)
        self._cache: dict = {}

    def _memo(self, key, make: Callable):
        if key not in self._cache:
            try:
                self._cache[key] = (make(), None)
            except Exception as e:  # noqa: BLE001 - re-raised each time, as the uncached run
                self._cache[key] = (None, e)
        value, err = self._cache[key]
        if err is not None:
            raise err
        return value

    def eager_variant(self, name: str) -> dict:
        return self._memo(("variant", name), lambda: super(_CachedRuns, self).eager_variant(name))

    def record(self, low_precision: bool) -> list:
        return self._memo(("record", low_precision),
                          lambda: super(_CachedRuns, self).record(low_precision))

    def flipped_reference(self, chosen: dict) -> dict:
        key = ("flip", tuple(sorted((k, tuple(v)) for k, v in chosen.items())))
        return self._memo(key, lambda: super(_CachedRuns, self).flipped_reference(chosen))


class Plant:
    """A wrong compiled backward: while active, the first nonzero gradient trainc's backward
    returns is scaled by 1 + PLANT_SIZE ("scale") or one element of it moved by PLANT_SIZE of its norm
    ("element"). `changed`: some call changed a gradient's bits (a bf16 gradient scaled by
    1 + 1e-3 may round back to itself: nothing was planted)."""

    def __init__(self, kind: str):
        self.kind, self.changed, self._orig = kind, False, None

    def __enter__(self):
        self._orig = runtime._grads_by_input

        def planted(sig, results):
            results = list(results)
            for k, g in enumerate(results):  # the first gradient a wrong kernel can change
                if torch.is_tensor(g) and g.is_floating_point() and \
                        bool((torch.isfinite(g) & (g != 0)).any()):
                    results[k] = self._wrong(g)
                    self.changed |= not torch.equal(results[k], g)
                    break
            return self._orig(sig, results)
        runtime._grads_by_input = planted
        return self

    def __exit__(self, *exc):
        runtime._grads_by_input = self._orig

    def _wrong(self, g: torch.Tensor) -> torch.Tensor:
        d, size = g.double(), plant_size(g.dtype)
        if self.kind == "scale":
            return (d * (1 + size)).to(g.dtype)
        finite = torch.where(torch.isfinite(d), d, torch.zeros_like(d))
        flat = d.clone().reshape(-1)
        flat[flat.numel() // 2] += size * torch.linalg.vector_norm(finite).item()
        return flat.reshape(g.shape).to(g.dtype)


def judge_all(comp, eager, ref, low, parts, runs) -> dict[str, list[str]]:
    """config -> the values failing under it."""
    out = {}
    for label, relax in CONFIGS.items():
        failed, _ = _judge(comp, eager, ref, low, parts, runs, relax)
        out[label] = sorted({m.what for m in failed})
    return out


def policy_side(prog, backend: str) -> dict:
    """Judge the program (and its planted variants) in its own dtype."""
    torch._dynamo.reset()
    fn, make, seed = prog.fn(), prog.make_inputs, 0
    compiled = trainc.compile(fn, backend=backend)
    comp = _run(compiled, None, make(), seed)
    eager = _run(fn, None, make(), seed)
    ref = _run(fn, None, [_clone(x, torch.float64) for x in make()], seed, cast=torch.float64,
               tangent_dtypes=eager.tangent_dtypes)
    low, parts = None, {}
    if prog.dtype == torch.float64:
        low = _run(fn, None, [_clone(x, torch.float32) for x in make()], seed,
                   cast=torch.float32, tangent_dtypes=eager.tangent_dtypes)
    else:
        parts = _conditioning_parts(fn, make, seed, eager.tangent_dtypes, ref)
    runs = _CachedRuns(fn, make, seed, eager.tangent_dtypes)
    compared = [w for w, v in _values(comp) if torch.is_tensor(v) and v.is_floating_point()]
    out = {"compared": compared, "failing": judge_all(comp, eager, ref, low, parts, runs),
           "errors": errors(comp, eager, ref, low, parts), "planted": {}}
    for kind in PLANTS:
        with Plant(kind) as p:
            bad = _run(compiled, None, make(), seed)
        out["planted"][kind] = {"changed": p.changed,
                                "failing": judge_all(bad, eager, ref, low, parts, runs),
                                "err": {w: e[1] for w, e in
                                        errors(bad, eager, ref, low, parts).items()}}
    return out


def errors(comp, eager, ref, low, parts) -> dict[str, list]:
    """what -> [finite elements, err compiled, err eager, float32 hint, then each part of
    _conditioning_parts in PARTS order] (None where not measured)."""
    low_vals = dict(_values(low)) if low is not None else {}
    out = {}
    for (what, c), (_, e), (_, r) in zip(_values(comp), _values(eager), _values(ref)):
        if not (torch.is_tensor(c) and c.is_floating_point() and torch.is_tensor(e)
                and c.shape == e.shape == r.shape):
            continue
        mask = torch.isfinite(c) & torch.isfinite(e) & torch.isfinite(r)
        if not bool(mask.any()):
            continue
        hint = _low_precision_err(low_vals.get(what), r)
        out[what] = [int(mask.sum()), rel_err(c, r, mask), rel_err(e, r, mask), hint] + [
            parts.get(name, {}).get(what) for name in PARTS]
    return out


def _gradcheck_fn(fn: Callable, inputs: list) -> Callable:
    """fn over its requires-grad inputs, always traced with grad on and those inputs requiring
    grad (gradcheck's finite differences would otherwise make Dynamo compile an inference
    graph: a different compiled function than the one checked), floating outputs only."""
    idx = [i for i, x in enumerate(inputs) if x.requires_grad]

    def f(*wrt):
        args = list(inputs)
        for i, w in zip(idx, wrt):
            args[i] = w if w.requires_grad else w.detach().requires_grad_()
        with torch.enable_grad():
            outs, _ = tree_flatten(fn(*args))
        return tuple(o for o in outs if torch.is_tensor(o) and o.is_floating_point()
                     and o.requires_grad)
    return f


def gradcheck(fn: Callable, inputs: list, args) -> bool:
    wrt = [x for x in inputs if x.requires_grad]
    return torch.autograd.gradcheck(_gradcheck_fn(fn, inputs), wrt, eps=args.eps,
                                    atol=args.atol, rtol=args.rtol, fast_mode=True,
                                    raise_exception=False)


def gradcheck_side(prog, backend: str, args) -> dict:
    """float64 gradcheck of the compiled program (clean and planted), eager's as the control."""
    torch._dynamo.reset()
    xs = []
    for x in prog.make_inputs():
        y = _clone(x, torch.float64)
        if torch.is_tensor(y) and 0 in y.stride():  # gradcheck perturbs storage: no overlap
            y = torch.empty(y.shape, dtype=y.dtype).copy_(y).requires_grad_(x.requires_grad)
        xs.append(y)
    fn = prog.fn()
    wrt = [x for x in xs if x.requires_grad]
    with torch.enable_grad():
        outs = _gradcheck_fn(fn, xs)(*wrt) if wrt else ()
    if not wrt or not outs:
        return {"status": "no gradient"}
    grads = torch.autograd.grad(outs, wrt, [torch.ones_like(o) for o in outs], allow_unused=True)
    if not all(bool(torch.isfinite(t).all()) for t in list(xs) + list(outs) + list(grads)
               if torch.is_tensor(t) and t.is_floating_point()):
        return {"status": "non-finite"}
    if not gradcheck(fn, xs, args):
        return {"status": "not differentiable here"}
    compiled = trainc.compile(prog.fn(), backend=backend)
    out = {"status": "pass" if gradcheck(compiled, xs, args) else "FAIL", "planted": {}}
    for kind in PLANTS:
        with Plant(kind) as p:
            ok = gradcheck(compiled, xs, args)
        out["planted"][kind] = {"changed": p.changed, "caught": not ok}
    return out


REFUSED = (trainc.UnsupportedError,)


def review(prog, backend: str, args) -> dict:
    row = {"backend": backend, "dtype": str(prog.dtype).replace("torch.", ""),
           "source": prog.source}
    t0 = time.time()
    try:
        row["policy"] = policy_side(prog, backend)
        row["gradcheck"] = gradcheck_side(prog, backend, args)
    except REFUSED as e:
        row["refused"] = str(e)[:200]
    except (NotImplementedError, ValueError) as e:
        if not str(e).startswith("trainc:"):
            row["crash"] = traceback.format_exc()[-2000:]
        else:
            row["refused"] = str(e)[:200]
    except Exception:  # noqa: BLE001 - a crash is a finding; the review goes on
        row["crash"] = traceback.format_exc()[-2000:]
    row["seconds"] = round(time.time() - t0, 2)
    return row


def tables(rows: list[dict]) -> str:
    lines = []
    for backend in sorted({r["backend"] for r in rows}):
        rs = [r for r in rows if r["backend"] == backend]
        lines += _backend_tables(backend, rs)
    return "\n".join(lines)


def _backend_tables(backend: str, rs: list[dict]) -> list[str]:
    ok = [r for r in rs if "policy" in r and "gradcheck" in r]
    status = collections.Counter(r["gradcheck"]["status"] for r in ok)
    n_vals = sum(len(r["policy"]["compared"]) for r in ok)
    fail_all_on = [r for r in ok if r["policy"]["failing"]["all on"]]
    secs = sum(r["seconds"] for r in rs)
    dtypes = collections.Counter(r["dtype"] for r in ok)
    out = [f"**{backend}**: {len(rs)} programs ({', '.join(f'{d} {n}' for d, n in sorted(dtypes.items()))}), "
           f"{len(rs) - len(ok)} refused/crashed ({sum('crash' in r for r in rs)} crashed), "
           f"{n_vals} compared floating values, {sum(r['seconds'] for r in rs):.0f} s "
           f"({secs / max(1, len(rs)):.1f} s a program). Policy with all relaxations on fails "
           f"{len(fail_all_on)} program(s). float64 gradcheck of the compiled program: "
           + ", ".join(f"{k} {v}" for k, v in sorted(status.items())) + ".", "",
           "| relaxation off | values admitted (f32/bf16/f64) | programs | of those, compiled "
           "gradcheck FAIL | gradcheck pass | gradcheck skipped | planted bugs it let through |",
           "|---|---|---|---|---|---|---|"]
    for label in [n for n in CONFIGS if n != "all on"]:
        admitted = collections.Counter()
        progs = collections.Counter()
        for r in ok:
            extra = set(r["policy"]["failing"][label]) - set(r["policy"]["failing"]["all on"])
            if extra:
                admitted[r["dtype"]] += len(extra)
                progs[_gc_class(r)] += 1
        let_through = 0
        for r in ok:
            for kind, p in r["policy"]["planted"].items():
                if p["changed"] and not p["failing"]["all on"] and p["failing"][label]:
                    let_through += 1
        total = sum(admitted.values())
        out.append(f"| {label} | {total} ({admitted['float32']}/{admitted['bfloat16']}/"
                   f"{admitted['float64']}) | {sum(progs.values())} | {progs['FAIL']} | "
                   f"{progs['pass']} | {progs['skipped']} | {let_through} |")
    out += ["", "| planted bug | dtype | planted (bits changed) | policy catches (all on) | "
            "gradcheck-able (float64) | gradcheck catches | policy misses, gradcheck catches |",
            "|---|---|---|---|---|---|---|"]
    for kind in PLANTS:
        for dtype in sorted(dtypes):
            of = [r for r in ok if r["dtype"] == dtype]
            planted = [r for r in of if r["policy"]["planted"][kind]["changed"]]
            caught = [r for r in planted if r["policy"]["planted"][kind]["failing"]["all on"]]
            gc = [r for r in of if r["gradcheck"]["status"] == "pass"
                  and r["gradcheck"]["planted"][kind]["changed"]]
            gc_caught = [r for r in gc if r["gradcheck"]["planted"][kind]["caught"]]
            only_gc = [r for r in gc_caught if r["policy"]["planted"][kind]["changed"]
                       and not r["policy"]["planted"][kind]["failing"]["all on"]]
            size = plant_size(getattr(torch, dtype))
            what = "x(1+{:g})".format(size) if kind == "scale" else f"+{size:g}*norm"
            out.append(f"| {kind} {what} | {dtype} | {len(planted)} | {len(caught)} "
                       f"({_pct(len(caught), len(planted))}) | {len(gc)} | {len(gc_caught)} "
                       f"({_pct(len(gc_caught), len(gc))}) | {len(only_gc)} |")
    return out + [""]


def _gc_class(r: dict) -> str:
    s = r["gradcheck"]["status"]
    return s if s in ("pass", "FAIL") else "skipped"


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=3406)
    ap.add_argument("--backends", default="cpp,aten")
    ap.add_argument("--max-ops", type=int, default=12)
    ap.add_argument("--skip", type=int, default=0, help="start at this program of the sample")
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--atol", type=float, default=1e-7)
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--out", default=None, help="append one JSON line per program and backend")
    ap.add_argument("--table", nargs="*", default=None, help="print the tables of these files")
    args = ap.parse_args()
    if args.table is not None:
        rows = [json.loads(line) for path in args.table for line in open(path) if line.strip()]
        print(tables(rows))
        return
    warnings.simplefilter("ignore")
    progs = sample(args.programs, args.seed, args.max_ops)[args.skip:]
    rows = []
    for i, prog in enumerate(progs):
        for backend in args.backends.split(","):
            row = review(prog, backend, args)
            row["index"] = args.skip + i
            rows.append(row)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
            if "crash" in row:
                print(f"program {row['index']} {backend}: crash\n{row['crash']}", file=sys.stderr)
        if (i + 1) % 10 == 0:
            print(f"-- {args.skip + i + 1} programs", flush=True)
    print(f"seed {args.seed}, {len(progs)} programs, max_ops {args.max_ops}, "
          f"gradcheck eps {args.eps} atol {args.atol} rtol {args.rtol}")
    print(tables(rows))


if __name__ == "__main__":
    main()
