"""Helpers for Triton backend tests: trace to core ATen, compile with backend="triton" on the
interpreter (CPU tensors) or CUDA, compare against eager."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

pytest.importorskip("triton", reason="triton is not installed")

from trainc import decomps  # noqa: E402
from trainc.codegen import CompiledGraph  # noqa: E402
from trainc.codegen.triton import TritonBackend  # noqa: E402
from trainc.config import make_config  # noqa: E402
from policy import assert_same  # noqa: E402,F401  (shared with the other test helpers)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def compile_triton(fn, *args, **options) -> CompiledGraph:
    """`options`: Config fields (make_config), e.g. triton_precise_div=True."""
    gm = make_fx(lambda *a: _tuple(fn(*a)), decomposition_table=decomps.TABLE,
                 tracing_mode="fake")(*args)
    return TritonBackend(make_config(**options) if options else None).compile(gm, list(args))


def _tuple(x):
    return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def check(fn, *args, rtol: float = 1e-5, atol: float = 1e-6) -> CompiledGraph:
    """Compile fn, run it on args, compare every output against eager fn(*args)."""
    args = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]
    c = compile_triton(fn, *args)
    outs = c.run(list(args))
    refs = _tuple(fn(*args))
    assert len(outs) == len(refs)
    for k, (o, r) in enumerate(zip(outs, refs)):
        assert_same(o, r, rtol, atol, f"output {k}")
    assert not c.fallback_ops, f"unexpected fallbacks {c.fallback_ops}"
    return c
