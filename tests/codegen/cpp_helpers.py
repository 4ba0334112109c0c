"""Helpers for codegen tests: trace a function to core ATen, compile it with the C++ backend,
compare against eager."""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from trainc import decomps
from trainc.codegen import CompiledGraph
from trainc.codegen.cpp import CppBackend
from policy import assert_same  # noqa: E402,F401  (shared with the other test helpers)


def compile_cpp(fn, *args, config=None) -> CompiledGraph:
    """fn(*args) -> tensor or tuple, traced with trainc's decompositions and compiled."""
    gm = make_fx(lambda *a: _tuple(fn(*a)), decomposition_table=decomps.TABLE,
                 tracing_mode="fake")(*args)
    return CppBackend(config).compile(gm, [None] * len(args))


def _tuple(x):
    return tuple(x) if isinstance(x, (list, tuple)) else (x,)


def check(fn, *args, rtol: float = 1e-5, atol: float = 1e-6) -> CompiledGraph:
    """Compile fn, run it on args, compare every output against eager fn(*args)."""
    c = compile_cpp(fn, *args)
    outs = c.run(list(args))
    refs = _tuple(fn(*args))
    assert len(outs) == len(refs)
    for k, (o, r) in enumerate(zip(outs, refs)):
        assert_same(o, r, rtol, atol, f"output {k}")
    assert not c.fallback_ops, f"unexpected fallbacks {c.fallback_ops}"
    return c
