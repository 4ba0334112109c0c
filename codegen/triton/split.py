"""Kernels that reduce a large tensor to scalars (outer == ()) -> a multi-block two-stage Triton
source: per loop, stage "a" spreads the loop over CHUNKS programs (partial results into scratch),
stage "b" combines the partials in one program. Deterministic: fixed chunks, no atomics.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trainc.codegen import ir
from trainc.codegen.scheduler import Kernel, Loop
from trainc.codegen.triton import reductions as R
from trainc.codegen.triton.exprs import TL, Body, compute

SPLIT_LIMIT = 1 << 16  # a scalar reduction over more elements than this runs on many programs
CHUNK_TARGET = 1 << 13  # elements per program, at least
MAX_CHUNKS = 1024
SPLIT_OPS = ("sum", "prod", "max", "min")


@dataclass(frozen=True)
class Stage:
    fn: str  # the @triton.jit function's name
    programs: int  # grid size


@dataclass(frozen=True)
class Scratch:
    name: str
    numel: int
    dtype: torch.dtype


def splittable(kern: Kernel, limit: int = SPLIT_LIMIT) -> bool:
    """Worth and able to split: a scalar kernel over more than `limit` elements with
    combinable reductions."""
    if kern.kind != "loops" or kern.outer is None or tuple(kern.outer) != ():
        return False
    if max((_numel(lp.inner) for lp in kern.loops), default=0) <= limit:
        return False
    return all(n.reduce_op in SPLIT_OPS for n in kern.nodes if n.kind == "reduction")


def chunks(r: int, target: int = CHUNK_TARGET, most: int = MAX_CHUNKS) -> int:
    """Programs of a split loop over r elements: `target` elements each, at most `most`."""
    return max(1, min(most, -(-r // target)))


def split_source(p) -> tuple[list[tuple[str, str]], list[Stage], list[Scratch]]:
    """Functions (as KernelSource.funcs), launch stages and scratch buffers for KernelPrinter
    `p` (mode "split"; each loop's programs as p.plan says).
    Every function takes the kernel's params then the scratch buffers, so one argument list
    serves all stages. Reduction results live in float scratch scalars for later loops."""
    scratch: list[Scratch] = []
    parts = {n.name: lplan.chunks for lp, lplan in zip(p.k.loops, p.plan.loops)
             for n in lp.steps}
    for n in p.k.nodes:
        if n.kind == "reduction":
            dt = R.acc_dtype(n)
            scratch.append(Scratch(f"{n.name}_part", parts[n.name], dt))
            scratch.append(Scratch(f"{n.name}_val", 1, compute(n.dtype)))
            p.rename_loads[n.name] = f"{n.name}_val"
            p.scratch_dtype[f"{n.name}_val"] = compute(n.dtype)
    bodies, stages = [], []
    for k, lp in enumerate(p.k.loops):
        p.values = {}
        body = Body(p, "    ")
        _stage_a(p, body, lp, k)
        bodies.append((f"_a{k}", body.lines))
        stages.append(Stage(f"{p.k.name}_a{k}", p.plan.loops[k].chunks))
        reds = [n for n in lp.steps if n.kind == "reduction"]
        if reds:
            body = Body(p, "    ")
            for n in reds:
                _stage_b(p, body, n, p.plan.loops[k].chunks)
            bodies.append((f"_b{k}", body.lines))
            stages.append(Stage(f"{p.k.name}_b{k}", 1))
    params = ", ".join(p.param_names() + [s.name for s in scratch])
    pid = "tl.program_id(0).to(tl.int64)" if p.plan.index64 else "tl.program_id(0)"
    funcs = []
    for suffix, lines in bodies:
        funcs.append((suffix, "\n".join(
            [f"({params}, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):",
             "    xindex = tl.arange(0, XBLOCK)[:, None]", "    xmask = xindex < 1",
             "    xz = tl.zeros([XBLOCK, 1], tl.int32)", f"    pid = {pid}"]
            + p.const_lines + lines)))
    return funcs, stages, scratch


def _stage_a(p, outer: Body, lp: Loop, k: int) -> None:
    """One chunk of the loop per program: pointwise stores as usual, partial reductions."""
    r = _numel(lp.inner)
    size = -(-r // p.plan.loops[k].chunks)
    isyms = p.syms.ranges("i", lp.inner)
    rindex, p.rmask, p.rz = f"rindex{k}", f"rmask{k}", f"rz{k}"
    reds = [n for n in lp.steps if n.kind == "reduction"]
    accs = {n.name: R.acc_init(p, outer, n, "RBLOCK") for n in reds}
    outer.emit(f"for r{k} in range(0, {size}, RBLOCK):")
    inner = outer.child()
    inner.emit(f"{rindex} = pid * {size} + r{k} + tl.arange(0, RBLOCK)[None, :]")
    inner.emit(f"{p.rmask} = ({rindex} < {r}) & (r{k} + tl.arange(0, RBLOCK)[None, :] < {size})")
    inner.emit(f"{p.rz} = tl.zeros([1, RBLOCK], tl.int32)")
    p._split(inner, rindex, isyms, tuple(lp.inner), "r")
    for n in lp.steps:
        if n.kind == "pointwise":
            v = inner.value(n.fn(isyms))
            if n.name not in p.k.local:
                b = p.k.layout(n.name, p.g)
                idx = inner.index(ir.linear(isyms, b.stride))
                p.store(inner, n.name, idx, v, f"xz + {p.rz}", f"xmask & {p.rmask}")
            p.values[n.name] = v
        else:
            R.accumulate(p, inner, n, accs[n.name], n.fn((), isyms), rindex)
    for n in reds:
        f = R.combine(p, outer, n, accs[n.name])
        outer.emit(f"tl.store({n.name}_part + pid + xz, {f}, mask=xmask)")


def _stage_b(p, body: Body, n, parts: int) -> None:
    """Combine the partials of reduction n (in chunk order) into its value."""
    width = 1 << max(parts - 1, 0).bit_length()
    op = n.reduce_op
    dt = R.acc_dtype(n)
    other = {"sum": "0", "prod": "1"}.get(op) or R.extreme(dt, op == "max")
    v, f = p.tmp(), p.tmp()
    body.emit(f"{v} = tl.load({n.name}_part + tl.arange(0, {width})[None, :] + xz, "
              f"mask=xmask & (tl.arange(0, {width})[None, :] < {parts}), other={other})")
    if op == "sum":
        body.emit(f"{f} = tl.sum({v}, 1)[:, None]")
    elif op == "prod":
        body.emit(f"{f} = tl.reduce({v}, 1, _prod)[:, None]")
    else:
        body.emit(f"{f} = {R.reduce_extremum(op, dt, v)}[:, None]")
    if R.expr_dtype(n) == torch.bool:
        body.emit(f"{f} = {f} != 0")
    body.emit(f"tl.store({n.name}_val + xz, {f}.to({TL[compute(n.dtype)]}), mask=xmask)")
    if n.name not in p.k.local:
        p.store(body, n.name, "0", f, "xz", "xmask")


def _numel(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out
