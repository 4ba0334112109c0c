"""Write every generated wrapper and kernel source of a fixed set of compiles into a directory,
to diff the generated code of two commits: the shared suite models (scale "cpu") compiled with
trainc.compile, forward and backward, and small programs through the backends directly, on cpp
and triton (triton on CPU tensors through its interpreter: set TRITON_INTERPRET=1).

    TRITON_INTERPRET=1 python benchmarks/dump_codegen.py OUT [cpp|triton ...]
    diff -r OUT_before OUT_after
"""
from __future__ import annotations

import copy
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRAINC_CACHE_ARTIFACTS", "0")
os.environ.setdefault("TRAINC_CPP_GEMM", "aten")  # "auto" times oneDNN per call: not reproducible

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import trainc  # noqa: E402
from trainc import decomps  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "suite_models"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import models  # noqa: E402
from shared_programs import scatters  # noqa: E402


def _embed_gather(w, idx, x, j):
    return F.embedding(idx, w) * 2, torch.gather(x, 1, j), x.index_select(0, idx[0])


def _index_put(x, idx, v):
    return x.index_put((idx,), v, accumulate=True), torch.zeros(16, 8).index_add(0, idx, v)


def _reductions(x, y):
    return (x.sum(), torch.softmax(x, -1), F.layer_norm(x, (x.shape[-1],)), x.sum(0),
            y.var(), y.amax(), (x.t() * 2).contiguous())


def _views(x):
    a, b = x.chunk(2, -1)
    return torch.cat([b, a], -1).view(4, 4, 2, 8).transpose(1, 2).reshape(4, -1) * a.sum()


def programs() -> list:
    """(name, fn, args) of small programs: indirect indexing, scatters, reductions, views."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)
    return [
        ("scatters", scatters, (r(5, 7), torch.tensor([[2], [0], [4], [4], [1]]), r(5, 7),
                                r(5, 1))),
        ("embed_gather", _embed_gather,
         (r(20, 8), torch.randint(0, 20, (3, 5), generator=g), r(20, 8),
          torch.randint(0, 8, (20, 3), generator=g))),
        ("index_put", _index_put, (r(16, 8), torch.randint(0, 16, (12,), generator=g), r(12, 8))),
        ("reductions", _reductions, (r(64, 48), r(300000))),
        ("views", _views, (r(4, 64),)),
    ]


def _backend(name: str):
    if name == "cpp":
        from trainc.codegen.cpp import CppBackend
        return CppBackend()
    from trainc.codegen.triton import TritonBackend
    return TritonBackend()


def dump_program(out: str, backend: str, name: str, fn, args) -> None:
    gm = make_fx(lambda *a: tuple(fn(*a)), decomposition_table=decomps.TABLE,
                 tracing_mode="fake")(*args)
    c = _backend(backend).compile(gm, list(args))
    with open(os.path.join(out, f"{backend}_prog_{name}.py"), "w") as f:
        f.write(c.source)


def dump_model(out: str, backend: str, name: str, dtype: torch.dtype, budget) -> None:
    model, inputs, loss_fn = models.build(name, dtype=dtype)
    tag = f"{backend}_{name}_{str(dtype)[6:]}_{budget}"
    step = trainc.compile(copy.deepcopy(model), backend=backend, memory_budget=budget,
                          debug_dir=os.path.join(out, tag))
    xs = tuple(x.detach().requires_grad_(x.requires_grad) for x in inputs)
    loss_fn(step(*xs), xs).backward()


def dump_step(out: str, backend: str, name: str) -> None:
    model, inputs, loss_fn = models.build(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = trainc.compile_step(model, lambda m, *b: loss_fn(m(*b), b), opt, backend=backend,
                               debug_dir=os.path.join(out, f"{backend}_{name}_step"))
    step(*inputs)


def main(out: str, backends: list[str]) -> None:
    os.makedirs(out, exist_ok=True)
    for backend in backends:
        for name, fn, args in programs():
            dump_program(out, backend, name, fn, args)
        for name in models.NAMES:
            for dtype in (torch.float32, torch.bfloat16):
                dump_model(out, backend, name, dtype, None)
            dump_model(out, backend, name, torch.float32, 0.0)
        dump_step(out, backend, "mlp")
        print(f"{backend}: done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["cpp", "triton"])
