"""Which of the policy's relaxations decide verdicts, and do they hide wrong gradients?

    python benchmarks/policy_audit.py [--n 200] [--seed 20263400] [--backend aten]

Draws float32 programs (no dropout), checks each compiled value as assert_grads_match does,
and records which relaxation of trainc/testing/policy.py a passing value needed: "small" (k
doubled below SMALL_NUMEL elements), "cond" (the conditioning estimate raised eager's error),
"ill" (eager's error above ILL_CONDITIONED: exact properties only). For each program that
needed one, the compiled program is run in float64 under torch.autograd.gradcheck (and eager's,
to discard programs whose own derivative is not smooth there, e.g. a ReLU at 0): a relaxation
that admits a program failing gradcheck while eager passes hides a real error.
"""
from __future__ import annotations

import argparse
import collections
import time
import warnings

import torch
from hypothesis import HealthCheck, Phase, given, seed, settings

import trainc
from trainc.testing import programs
from trainc.testing.check import _conditioning, _run, _values
from trainc.testing.policy import ILL_CONDITIONED, SMALL_NUMEL, TOLERANCES, rel_err


def relaxations(prog, backend: str) -> list[str]:
    """The relaxations that admitted some value of this program (empty: none needed)."""
    torch._dynamo.reset()
    fn = prog.fn()
    comp = _run(trainc.compile(fn, backend=backend), None, prog.make_inputs(), 0)
    eager = _run(fn, None, prog.make_inputs(), 0)
    ref = _run(fn, None, prog.make_inputs(torch.float64), 0, cast=torch.float64,
               tangent_dtypes=eager.tangent_dtypes)
    cond = _conditioning(fn, prog.make_inputs, 0, eager.tangent_dtypes, ref)
    k, floor = TOLERANCES[torch.float32]
    used = []
    for (what, c), (_, e), (_, r) in zip(_values(comp), _values(eager), _values(ref)):
        if not (torch.is_tensor(c) and c.is_floating_point() and c.shape == r.shape):
            continue
        mask = torch.isfinite(c) & torch.isfinite(e) & torch.isfinite(r)
        if not bool(mask.any()):
            continue
        e_c, e_e = rel_err(c, r, mask), rel_err(e, r, mask)
        if e_c <= k * e_e + floor:
            continue
        hint = max(e_e, cond.get(what, 0.0))
        small = int(mask.sum()) < SMALL_NUMEL
        if small and e_c <= 2 * k * e_e + floor:
            used.append("small")
        elif e_c <= k * hint + floor or (small and e_c <= 2 * k * hint + floor):
            used.append("cond")
        elif hint > ILL_CONDITIONED:
            used.append("ill")
        else:
            used.append("FAIL")
    return used


def gradcheck_ok(fn, inputs) -> bool:
    wrt = [x for x in inputs if x.requires_grad]
    if not wrt:
        return True

    def f(*args):
        it = iter(args)
        full = [next(it) if x.requires_grad else x for x in inputs]
        return tuple(o for o in fn(*full) if o.requires_grad)
    try:
        return torch.autograd.gradcheck(f, wrt, fast_mode=True, atol=1e-6, rtol=1e-4,
                                        raise_exception=False)
    except RuntimeError:
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--seed", type=int, default=20263400)
    p.add_argument("--backend", default="aten")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    t0, seen = time.time(), [0]

    @seed(args.seed)
    @settings(max_examples=args.n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(programs(dtypes=(torch.float32,), dropout=False, max_ops=12))
    def audit(prog):
        seen[0] += 1
        if seen[0] % 10 == 0:  # a running tally: a time-limited run still reports
            report(stats, seen[0], args, t0)
        try:
            used = set(relaxations(prog, args.backend))
        except (trainc.UnsupportedError, NotImplementedError, ValueError):
            return
        if not used:
            stats["none"]["programs"] += 1
            return
        torch._dynamo.reset()
        xs = prog.make_inputs(torch.float64)
        eager_ok = gradcheck_ok(prog.fn(), xs)
        comp_ok = gradcheck_ok(trainc.compile(prog.fn(), backend=args.backend), xs)
        for name in used:
            c = stats[name]
            c["programs"] += 1
            c["gradcheck: both pass" if comp_ok and eager_ok else
              "gradcheck: eager fails too" if not eager_ok else
              "gradcheck: ONLY COMPILED FAILS"] += 1
            if eager_ok and not comp_ok:
                print(f"--- {name}: compiled float64 fails gradcheck, eager passes{prog!r}")
    audit()
    report(stats, seen[0], args, t0)


def report(stats: dict, n: int, args, t0: float) -> None:
    print(f"{n} programs, backend {args.backend}, seed {args.seed}, {time.time() - t0:.0f} s")
    for name, c in sorted(stats.items()):
        print(f"  {name:6s} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())), flush=True)


if __name__ == "__main__":
    main()
