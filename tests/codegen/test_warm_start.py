"""Warm start (trainc/artifact_cache.py): a fresh process that compiles the same model as an
earlier one, with trainc.compile or compile_step, on cpp and on triton (TRITON_INTERPRET=1),
loads every graph from the cache, runs no tracing, passes, partition or codegen, and computes
bitwise the same results; explain says which key part differed on a miss."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = r"""
import hashlib, json, sys, torch
import trainc
from trainc import pipeline, records, step as step_mod
from trainc.codegen.cpp import CppBackend
from trainc.codegen.triton import TritonBackend
backend, mode = sys.argv[1], sys.argv[2]
calls = {"trace": 0, "passes": 0, "partition": 0, "codegen": 0}
def count(name, fn):
    def wrapped(*a, **k):
        calls[name] += 1
        return fn(*a, **k)
    return wrapped
pipeline.trace_joint = count("trace", pipeline.trace_joint)
pipeline.run_passes = count("passes", pipeline.run_passes)  # compile_step's stages too
pipeline.partition = count("partition", pipeline.partition)
step_mod.recompute_in_step = count("partition", step_mod.recompute_in_step)
CppBackend.compile = count("codegen", CppBackend.compile)
TritonBackend.compile = count("codegen", TritonBackend.compile)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                        torch.nn.Linear(32, 3))
x, y = torch.randn(6, 12), torch.randint(0, 3, (6,))
loss_fn = lambda model, x, y: torch.nn.functional.cross_entropy(model(x), y)
with records.recording() as recs:
    if mode == "compile":
        f = trainc.compile(m, backend=backend)
        outs = []
        for _ in range(2):
            loss = loss_fn(f, x, y)
            loss.backward()
            outs.append(loss.detach())
    else:
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        step = trainc.compile_step(m, loss_fn, opt, backend=backend)
        outs = [step(x, y).detach() for _ in range(3)]
tensors = outs + [p.detach() for p in m.parameters()] + \
    [p.grad for p in m.parameters() if p.grad is not None]
digest = hashlib.sha256(b"".join(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                                 for t in tensors)).hexdigest()
print(json.dumps([calls, [r.cache for r in recs], digest]))
"""


def _run(cache, backend, mode):
    env = dict(os.environ, TRAINC_CACHE_DIR=str(cache), TRAINC_CACHE_ARTIFACTS="1",
               TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT, backend, mode], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("mode", ["compile", "step"])
def test_warm_process_skips_every_stage_and_matches_bitwise(tmp_path, backend, mode):
    calls, statuses, cold = _run(tmp_path, backend, mode)
    assert calls["codegen"] > 0 and calls["passes"] > 0
    assert statuses and all(s.startswith("miss") and s.endswith("stored") for s in statuses), \
        statuses
    calls, statuses, warm = _run(tmp_path, backend, mode)
    assert calls == {"trace": 0, "passes": 0, "partition": 0, "codegen": 0}, calls
    assert statuses and all(s == "hit" for s in statuses), statuses
    assert warm == cold, "the warm process computed different bits"


def test_explain_names_the_key_part_that_missed(tmp_path, monkeypatch):
    import trainc
    from trainc import cache_store
    monkeypatch.setenv("TRAINC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRAINC_CACHE_ARTIFACTS", "1")
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def explain(x, **options):
        torch._dynamo.reset()
        return [g.cache for g in trainc.explain(m, x, backend="cpp", **options).graphs]

    x = torch.randn(4, 8)
    assert explain(x) == ["miss (no entries); stored"]
    assert explain(x) == ["hit"]
    assert explain(x.double().float().t().contiguous().t())[0].startswith(
        "miss (nearest entry differs in: inputs)")
    assert explain(x, cpp_keep_buffers=False)[0].startswith(
        "miss (nearest entry differs in: options)")
    old = torch.get_num_threads()
    torch.set_num_threads(1 if old > 1 else 2)
    try:
        assert explain(x)[0].startswith("miss (nearest entry differs in: numerics)")
    finally:
        torch.set_num_threads(old)
    text = str(trainc.explain(m, x, backend="cpp"))
    assert "graph_" in text and "cache: hit" in text
    assert cache_store.subdir(trainc.config.make_config(), "artifacts") is not None
