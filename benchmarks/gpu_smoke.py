"""GPU smoke check: trainc.compile and compile_step on CUDA against eager and a float64 reference.

    python benchmarks/gpu_smoke.py [--backend aten] [--scale cpu] [--only "in place,dropout"]

Prints one line per check (PASS/FAIL with errors) and exits non-zero if any check failed.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import traceback

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
for bench in (os.path.join(HERE, "suite_models"),):
    if os.path.isdir(bench):
        sys.path.insert(0, bench)

import models  # noqa: E402
import trainc  # noqa: E402
from policy import assert_policy  # noqa: E402

FAILURES: list[str] = []


ONLY: list[str] = []  # --only: run the checks whose name contains one of these


def check(name: str, fn) -> None:
    if ONLY and not any(o in name for o in ONLY):
        return
    try:
        fn()
        print(f"PASS {name}", flush=True)
    except Exception as e:  # report every check, then fail at the end
        FAILURES.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        traceback.print_exc(limit=3)


def grads_match(name: str, backend: str, scale: str, dtype=torch.float32) -> None:
    model, inputs, loss = models.build(name, "cuda", scale, dtype=dtype)
    runs = {}
    for kind in ("eager", "trainc", "ref"):
        m = copy.deepcopy(model).double() if kind == "ref" else copy.deepcopy(model)
        xs = tuple((x.double() if kind == "ref" and x.is_floating_point() else x).detach()
                   .requires_grad_(x.requires_grad) for x in inputs)
        f = trainc.compile(m, backend=backend) if kind == "trainc" else m
        l = loss(f(*xs), xs)
        l.backward()
        runs[kind] = (l.detach(), [p.grad for p in m.parameters()], m.state_dict())
    (le, ge, se), (lc, gc, sc), (lr, gr, sr) = runs["eager"], runs["trainc"], runs["ref"]
    assert_policy("loss", lc, le, lr)
    for i, (c, e, r) in enumerate(zip(gc, ge, gr)):
        assert_policy(f"grad {i}", c, e, r)
    for k in sr:
        assert_policy(f"state {k}", sc[k], se[k], sr[k])


def step_matches(name: str, backend: str, scale: str, steps: int = 5) -> None:
    model, inputs, loss = models.build(name, "cuda", scale)
    xs = tuple(x.detach() for x in inputs)
    lf = lambda m, *b: loss(m(*b), b)
    out = {}
    for kind in ("eager", "trainc", "ref"):
        m = copy.deepcopy(model).double() if kind == "ref" else copy.deepcopy(model)
        b = tuple(x.double() if kind == "ref" and x.is_floating_point() else x for x in xs)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
        step = trainc.compile_step(m, lf, opt, backend=backend) if kind == "trainc" else None
        losses = []
        for _ in range(steps):
            if step is not None:
                losses.append(step(*b))
            else:
                l = lf(m, *b)
                l.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(l.detach())
        out[kind] = (losses, m.state_dict())
    for i, (c, e, r) in enumerate(zip(out["trainc"][0], out["eager"][0], out["ref"][0])):
        assert_policy(f"loss {i}", c, e, r)
    for k in out["ref"][1]:
        assert_policy(k, out["trainc"][1][k], out["eager"][1][k], out["ref"][1][k])


def autocast_step(backend: str) -> None:
    model, inputs, loss = models.build("gpt", "cuda", "cpu")
    xs = tuple(x.detach() for x in inputs)
    lf = lambda m, *b: loss(m(*b), b)
    me, mc = copy.deepcopy(model), copy.deepcopy(model)
    oe, oc = (torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (me, mc))
    step = trainc.compile_step(mc, lf, oc, backend=backend)
    for _ in range(5):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            l = lf(me, *xs)
            lc = step(*xs)
        l.backward()
        oe.step()
        oe.zero_grad(set_to_none=True)
    rel = abs(lc.item() - l.item()) / abs(l.item())
    assert rel < 2e-2, f"autocast loss after 5 steps: trainc {lc.item()} eager {l.item()}"


def dropout_mask(backend: str) -> None:
    f = trainc.compile(lambda x: F.dropout(x * 2, 0.4, training=True), backend=backend)
    x = torch.randn(4096, 257, device="cuda", requires_grad=True)
    y = f(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y.detach() != 0).float() * 2 / 0.6)


def step_in_place(name: str, backend: str, scale: str) -> None:
    """compile_step keeps parameters and AdamW state where they are (no second copy) and its
    peak stays below eager's (foreach AdamW) one step."""
    model, inputs, loss = models.build(name, "cuda", scale)
    lf = lambda m, *b: loss(m(*b), b)
    peaks = {}
    for kind in ("eager", "trainc"):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True)
        step = trainc.compile_step(m, lf, opt, backend=backend) if kind == "trainc" else None

        def run():
            if step is not None:
                return step(*inputs)
            l = lf(m, *inputs)
            l.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        run()
        run()
        ptrs = [t.data_ptr() for t in m.parameters()] + \
            [t.data_ptr() for s in opt.state.values() for t in s.values()]
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        peaks[kind] = (torch.cuda.max_memory_allocated() - base) / 2**20
        now = [t.data_ptr() for t in m.parameters()] + \
            [t.data_ptr() for s in opt.state.values() for t in s.values()]
        assert now == ptrs, f"{kind}: parameters or optimizer state moved"
    print(f"  step peak MiB above start: {peaks}", flush=True)
    assert peaks["trainc"] <= peaks["eager"] * 1.05, peaks


def cudagraph_step(backend: str) -> None:
    model, inputs, loss = models.build("mlp", "cuda", "cpu")
    lf = lambda m, *b: loss(m(*b), b)
    ma, mb = copy.deepcopy(model), copy.deepcopy(model)
    sa = trainc.compile_step(ma, lf, torch.optim.AdamW(ma.parameters(), lr=1e-3),
                             backend=backend, cudagraphs=True)
    sb = trainc.compile_step(mb, lf, torch.optim.AdamW(mb.parameters(), lr=1e-3),
                             backend=backend)
    for _ in range(5):
        torch.testing.assert_close(sa(*inputs), sb(*inputs))
    for p, q in zip(ma.parameters(), mb.parameters()):
        torch.testing.assert_close(p, q)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="aten")
    ap.add_argument("--scale", default="cpu")
    ap.add_argument("--only", default="", help="comma-separated substrings of check names")
    a = ap.parse_args()
    ONLY.extend(o for o in a.only.split(",") if o)
    # cuDNN convolutions default to TF32 (10-bit mantissa) in float32; the policy compares
    # float32 errors, and two TF32 algorithms differ by far more than float32 rounding.
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, backend {a.backend}, "
          f"cudnn TF32 off")
    for name in models.NAMES:
        check(f"grads {name} {a.scale}", lambda: grads_match(name, a.backend, a.scale))
        check(f"compile_step {name} {a.scale}", lambda: step_matches(name, a.backend, a.scale))
    for name in models.NAMES:
        check(f"grads bfloat16 {name} {a.scale}",
              lambda: grads_match(name, a.backend, a.scale, torch.bfloat16))
    for name in models.NAMES:
        check(f"compile_step in place {name} {a.scale}",
              lambda: step_in_place(name, a.backend, a.scale))
    check("compile_step cudagraphs mlp", lambda: cudagraph_step(a.backend))
    check("compile_step autocast bf16 gpt", lambda: autocast_step(a.backend))
    check("dropout mask cuda", lambda: dropout_mask(a.backend))
    print(f"{len(FAILURES)} failed: {FAILURES}")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
