"""Compiled artifacts cached on disk (trainc/artifact_cache.py): a second process skips tracing
and codegen and computes bitwise the same loss, gradients and buffer updates; the key tells
apart what changes the compiled code."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from trainc import artifact_cache
from trainc.config import make_config

SCRIPT = r"""
import json, sys, torch
sys.path.insert(0, {bench!r})
import models, trainc
from trainc import pipeline
from trainc import artifact_cache
calls, variants = [], []
real = pipeline.trace_joint
pipeline.trace_joint = lambda *a, **k: calls.append(1) or real(*a, **k)
real_variant = artifact_cache.load_variant
artifact_cache.load_variant = lambda *a: variants.append(real_variant(*a) is not None) or real_variant(*a)
out = {{}}
for name in ("convnet", "normact"):
    m, x, loss = models.build(name)
    f = trainc.compile(m, backend="cpp")
    ls = [models.step(f, x, loss).item() for _ in range(2)]
    out[name] = [ls, [p.grad.sum().item() for p in m.parameters()],
                 [b.float().sum().item() for b in m.buffers()]]
print(json.dumps([len(calls), out, variants]))
"""


def _run(cache: str) -> tuple:
    env = dict(os.environ, TRAINC_CACHE_DIR=cache, TRAINC_CACHE_ARTIFACTS="1")
    bench = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "suite_models")
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(bench=os.path.abspath(bench))],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def test_second_process_loads_the_artifact_and_matches_bitwise(tmp_path):
    traced, first, variants = _run(str(tmp_path))
    assert traced == 2 and os.listdir(tmp_path / "artifacts")
    # normact's loss is out.sum(): its backward for the expanded tangent is compiled and stored
    assert variants == [False]
    assert any("_t" in f for f in os.listdir(tmp_path / "artifacts"))
    traced, second, variants = _run(str(tmp_path))
    assert traced == 0, "the second process re-traced instead of loading the artifact"
    assert variants == [True], "the second process did not load the expanded-tangent backward"
    assert first == second


def _key(fn, args, **options):
    gm = make_fx(fn)(*args)
    return artifact_cache.key(gm, args, ["user"] * len(args), True,
                              make_config(cache_artifacts=True, **options))


def test_key_tells_apart_layouts_dtypes_aliasing_and_config():
    f = lambda a, b: (a * 2 + b,)  # noqa: E731
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    base = _key(f, [x, y])
    assert base is not None and base == _key(f, [x.clone(), y.clone()])
    others = [_key(f, [x.t().contiguous().t(), y]), _key(f, [x.double(), y]),
              _key(f, [x.clone().requires_grad_(True), y]), _key(f, [x, x]),
              _key(f, [x, y], cpp_flags="-O1 -fopenmp"), _key(lambda a, b: (a * 3 + b,), [x, y])]
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        others.append(_key(f, [x, y]))
    finally:
        torch.set_default_dtype(old)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        others.append(_key(f, [x, y]))
    assert base not in others and len(set(others)) == len(others)


def test_key_is_none_when_off_or_dumping():
    f = lambda a: (a + 1,)  # noqa: E731
    x = torch.randn(3)
    gm = make_fx(f)(x)
    assert artifact_cache.key(gm, [x], ["user"], True, make_config(cache_artifacts=False)) is None
    assert artifact_cache.key(gm, [x], ["user"], True,
                              make_config(cache_artifacts=True, debug_dir="/tmp/x")) is None
