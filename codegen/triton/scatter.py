"""Scatter kernels -> Triton functions: `_init` writes out = init(i), the main function does
out[index(v)] op= fn(v) (atomic adds), and a bf16/fp16 add accumulates in a float32 scratch that
`_cast` rounds into out (KernelPlan.accumulate32). Functions of a KernelPrinter `p`.
"""
from __future__ import annotations

import torch

from trainc.codegen import ir
from trainc.codegen.triton.exprs import Body
from trainc.codegen.triton.split import Scratch


def scatter_source(p) -> tuple[list[tuple[str, str]], tuple[Scratch, ...]]:
    """The functions (as KernelSource.funcs) and scratch buffers of scatter kernel p.k. The
    float32 scratch: Triton has no 16-bit atomic_add on every target (its interpreter has
    none), and float32 sums are exacter."""
    n = p.k.nodes[0]
    out = p.g.buffers[n.name]
    acc = "acc" if p.plan.accumulate32 else ""
    init = Body(p, "    ")
    ssyms = p.syms.ranges("s", n.shape)
    p._split(init, "xindex", ssyms, n.shape, "x")
    v = init.value(n.init(ssyms))
    if acc:
        init.emit(f"tl.store({acc} + xindex, {v}, mask=xmask)")
    else:
        p.store(init, n.name, init.index(ir.linear(ssyms, out.stride)), v, "xz", "xmask")
    body = Body(p, "    ")
    vsyms = p.syms.ranges("v", n.rshape)
    p._split(body, "xindex", vsyms, n.rshape, "x")
    v = body.value(n.fn(vsyms))
    if acc:
        body.emit(f"tl.atomic_add({acc} + {body.index(n.index(vsyms))} + xz, {v}, "
                  f"mask=xmask)")
    else:
        p.store(body, n.name, body.index(n.index(vsyms)), v, "xz", "xmask",
                atomic=n.reduce_op == "add")
    funcs = [("_init", init, _numel(n.shape)), ("", body, _numel(n.rshape))]
    scratch: tuple = ()
    if acc:
        cast = Body(p, "    ")
        p._split(cast, "xindex", ssyms, n.shape, "x")
        p.store(cast, n.name, cast.index(ir.linear(ssyms, out.stride)),
                f"tl.load({acc} + xindex, mask=xmask)", "xz", "xmask")
        funcs.append(("_cast", cast, _numel(n.shape)))
        scratch = (Scratch(acc, _numel(n.shape), torch.float32),)
    return [p._func(suffix, b, size, scratch=scratch) for suffix, b, size in funcs], scratch


def _numel(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out
