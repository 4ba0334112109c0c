"""Kernel + KernelPlan -> C++ source: OpenMP-parallel outer loop, `omp simd` innermost loops.

The printer decides nothing: every choice (lanes, hoists, reuse, tiles, unrolls, a thread
split) is in the kernel's plan (codegen/cpp/plan.py); values are spelled by
codegen/cpp/exprs.py, reductions by codegen/cpp/reductions.py. Every pointer is __restrict__.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from trainc.codegen import ir
from trainc.codegen.cpp import reductions as R
from trainc.codegen.cpp.exprs import STORAGE, Body, ctype, index_code, stored
from trainc.codegen.cpp.plan import (MIN_INNER, SCRATCH_BYTES, KernelPlan, LoopPlan,  # noqa: F401
                                     kernel_writes, plan_kernel)
from trainc.codegen.cpp.threads import split_for, split_threads_header
from trainc.codegen.cpp.transpose import ROW as TILE_ROW
from trainc.codegen.cpp.transpose import open_block, write_block
from trainc.codegen.graph import ComputeNode, LoweredGraph
from trainc.codegen.scheduler import Kernel, within_outer


@dataclass(frozen=True)
class KernelSource:
    code: str  # the kernel's C++ function
    params: tuple[str, ...]  # its parameter buffers, in order


class KernelPrinter:
    """Spells one kernel from its plan; the state here is only what printing tracks."""

    def __init__(self, kern: Kernel, plan: KernelPlan, g: LoweredGraph):
        if plan.name != kern.name:
            raise ValueError(f"trainc cpp: plan of {plan.name} given for kernel {kern.name}")
        if plan.mode != "scatter" and len(plan.loops) != len(kern.loops):
            raise ValueError(f"trainc cpp: plan of {kern.name} has {len(plan.loops)} loops, "
                             f"the kernel {len(kern.loops)}")
        self.k, self.plan, self.g = kern, plan, g
        self.syms = plan.scope
        self.lanes = plan.lanes
        self.exprs = plan.exprs
        self.params: dict[str, bool] = {}  # buffer -> written
        self.values: dict[str, str] = {}  # buffer -> C var holding its value here
        self._tmp = 0
        self.narrow: dict = {}  # expr -> computed in int32 (codegen/cpp/narrow.py)
        self.narrow_names: set[str] = set()  # the C variables holding such values
        # an in-place result is stored into the buffer it overwrites (codegen/memory/inplace.py):
        # one pointer, so __restrict__ stays true
        self.rename = {n.name: g.storage[n.name] for n in kern.nodes if n.name in g.storage}
        self.written = kernel_writes(kern, g)
        self._consts: dict[str, str] = {}  # load text -> name, read once before the loops
        self.parts: list[str] = []  # shared partial arrays of a thread split
        self.acc_types: dict[str, str] = {}
        self._guard = False  # stores only from thread 0 (values every thread holds)
        self._tiles: dict[str, str] = {}  # node -> store index, stored through a tile here

    def tmp(self) -> str:
        self._tmp += 1
        return f"t{self._tmp}"

    def load(self, body: Body, e: ir.Load) -> str:
        if e.buf in self.values:
            return self.values[e.buf]
        if e.buf in self.k.scratch:
            x = f"{e.buf}_s[{self._scratch_slot(body, e.buf, e.index)}]"
            return f"({x} != 0)" if e.dtype == torch.bool else x
        param = self.rename.get(e.buf, e.buf)
        self.params.setdefault(param, False)
        constant = sympy.sympify(e.index).is_Integer and param not in self.written
        x = f"{param}[{e.index if constant else body.index(e.index)}]"
        dt = self.g.buffers[e.buf].dtype
        if dt == torch.bool:
            x = f"({x} != 0)"
        elif dt in (torch.bfloat16, torch.float16):
            x = f"bf2f({x})" if dt == torch.bfloat16 else f"(float){x}"
        if not constant:
            return x
        # one element at a fixed place (a 0-d input, an expanded tangent): read once before the
        # loops; inside a simd loop GCC can leave it in the latch and not vectorize the loop
        if x not in self._consts:
            self._consts[x] = f"k{len(self._consts)}"
        return self._consts[x]

    def store(self, body: Body, n: ComputeNode, index: str, v: str, op: str = "=") -> None:
        param = self.rename.get(n.name, n.name)
        self.params[param] = True
        target = f"{param}[{index}]"
        if op == "+=":
            cur = f"bf2f({target})" if n.dtype == torch.bfloat16 else target
            v = f"({cur} + {v})"
        body.emit(f"{'if (tid == 0) ' if self._guard else ''}{target} = {stored(n.dtype, v)};")

    def _scratch_slot(self, body: Body, buf: str, index) -> str:
        """Where `buf[index]` lives in the buffer's scratch array (lane-major with lanes)."""
        b = self.k.layout(buf, self.g)
        h = within_outer(index, list(self.plan.osyms), b.stride, b.shape)
        assert h is not None, f"trainc cpp: scratch read of {buf} leaves its outer iteration"
        return f"{body.index(h)} * {self.lanes} + j" if self.lanes else body.index(h)

    # -- kernel ---------------------------------------------------------------------------
    def source(self) -> KernelSource:
        fills = self._hoist_fills()
        body = Body(self, "    ")
        if self.plan.mode == "scatter":
            self._scatter(body, self.k.nodes[0])
        else:
            for k, (lp, loop) in enumerate(zip(self.k.loops, self.plan.loops)):
                self._loop(body, k, lp, loop)
        return KernelSource(self._wrap(fills, body), tuple(self.params))

    def _hoist_fills(self) -> list[str]:
        """Loops computing the hoisted values (codegen/cpp/hoist.py) once, before the kernel's
        parallel loop: one simd loop per vectorized index."""
        groups: dict[tuple, list] = {}
        for h in self.plan.hoists:
            groups.setdefault((h.sym, h.extent), []).append(h)
        lines = []
        for (v, n), hs in groups.items():
            lines += [f"  alignas(64) {ctype(h.expr.dtype)} {h.name}[{n}];" for h in hs]
            body = Body(self, "    ")
            for h in hs:
                body.emit(f"{h.name}[{v.name}] = {body.value(h.expr)};")
            lines += ["  #pragma omp simd", f"  for (int64_t {v.name} = 0; {v.name} < {n}; "
                      f"++{v.name}) {{", *body.lines, "  }"]
        return lines

    def _wrap(self, fills: list[str], body: Body) -> str:
        plan, osyms = self.plan, self.plan.osyms
        params = ", ".join(
            f"{'' if w else 'const '}{STORAGE[self.g.buffers[b].dtype]}* __restrict__ {b}"
            for b, w in self.params.items())
        on = _numel(plan.outer)
        lines = [f'extern "C" void {self.k.name}({params}) {{']
        if on == 0:
            return "\n".join(lines + ["}"])
        lines += [f"  const auto {name} = {x};" for x, name in self._consts.items()]
        lines += fills
        w = self.lanes or 1
        if plan.split:
            lines += self.parts + split_threads_header(plan.threads)
        if osyms and on > 1:
            if plan.parallel:
                lines.append("  #pragma omp parallel for")
            shape = list(plan.outer[:-1]) + [plan.outer[-1] // w]
            lines.append(f"  for (int64_t o = 0; o < {on // w}; ++o) {{")
            for i, (s, st, n) in enumerate(zip(osyms, ir.contiguous_strides(shape), shape)):
                if i == len(osyms) - 1 and self.lanes:
                    lines.append(f"    const int64_t lane0 = ((o / {st}) % {n}) * {w};")
                else:
                    lines.append(f"    const int64_t {s.name} = (o / {st}) % {n};")
        else:
            lines.append("  {")
            for s in osyms:
                lines.append(f"    const int64_t {s.name} = 0;")
        for b in sorted(self.k.scratch):  # one outer iteration of each kernel-internal buffer
            buf = self.k.layout(b, self.g)
            n = _numel(buf.shape[len(plan.outer):]) * w
            t = STORAGE[buf.dtype] if buf.dtype == torch.bool else ctype(buf.dtype)
            lines.append(f"    alignas(64) {t} {b}_s[{n}];")
        for r in plan.reuse:  # expensive values an earlier loop computed for later ones
            n = _numel(plan.loops[r.first].extents)
            lines.append(f"    alignas(64) {ctype(r.expr.dtype)} {r.name}[{n}];")
        lines += body.lines
        lines += ["  }"] + (["  }"] if plan.split else []) + ["}"]
        return "\n".join(lines)

    def _loop(self, outer: Body, k: int, lp, loop: LoopPlan) -> None:
        plan, osyms = self.plan, list(self.plan.osyms)
        isyms, dims, extents = list(loop.syms), list(loop.dims), loop.extents
        reds = [n for n in lp.steps if n.kind == "reduction"]
        unroll, tiny = loop.unroll, loop.tiny
        sets = [{n.name: R.acc_init(self, outer, n) for n in reds} for _ in range(unroll)]
        accs = sets[0]
        loop_syms, loop_extents = list(isyms), list(extents)
        if tiny:  # the innermost dim is unrolled below
            loop_syms, loop_extents = loop_syms[:-1], loop_extents[:-1]
        if unroll > 1:  # the innermost reduced dim runs `unroll` iterations per trip
            loop_extents[-1] = int(extents[-1]) // unroll
            loop_syms[-1] = loop.unroll_sym
        self._tiles = dict(loop.tiles)
        for d, (s, size) in enumerate(zip(loop_syms, loop_extents)):
            if d == len(loop_syms) - 1 and loop.simd and not self.lanes:
                outer.emit(R.simd_pragma(reds, accs))
            if self._tiles and d == len(loop_syms) - 1:
                types = {x: STORAGE[self.g.buffers[x].dtype] for x in self._tiles}
                open_block(outer, "  " * d, s, size, self.lanes, self._tiles, types)
                continue
            head = split_for(s.name, size) if plan.split and d == 0 else \
                f"for (int64_t {s.name} = 0; {s.name} < {size}; ++{s.name}) {{"
            outer.emit("  " * d + head)
        self._guard = plan.split and not isyms  # every thread runs the whole loop
        depth = len(loop_syms) + (1 if self._tiles else 0)  # a tiled loop runs in blocks
        if self.lanes:  # innermost: the lanes of the last outer dim, independent accumulators
            self.open_lanes(outer, "  " * depth, loop.simd)
            depth += 1
        elif not isyms:
            outer.emit("{")
        inner = Body(self, outer.indent + "  " * (max(depth, 1) + 1))
        inner.lines = outer.lines
        slot = index_code(ir.linear(isyms, ir.contiguous_strides(extents))) if isyms else "0"
        for r in plan.reuse:
            if k in r.later:
                inner.memo[r.expr] = f"{r.name}[{slot}]"
        for h in plan.hoists:
            if (h.sym, h.extent) == loop.vector:
                inner.memo[h.expr] = f"{h.name}[{h.sym.name}]"
        saved = dict(self.values)
        for g, acc_set in enumerate(sets if unroll > 1 else []):
            sub = {isyms[-1]: unroll * loop_syms[-1] + g}
            gdims = [sympy.sympify(d).subs(sub) for d in dims]
            for n in lp.steps:
                R.accumulate(inner, n, acc_set[n.name], n.fn(osyms, gdims), isyms, lp.inner)
        for g in range(tiny):
            gdims = [sympy.sympify(d).subs({isyms[-1]: g}) for d in dims]
            for n in lp.steps:
                self._pointwise(inner, n, osyms, gdims, n.fn(osyms + gdims))
        for n in lp.steps if unroll == 1 and not tiny else []:
            if n.kind == "pointwise":
                self._pointwise(inner, n, osyms, dims)
            else:
                R.accumulate(inner, n, accs[n.name], self.exprs[n.name], isyms, lp.inner)
        for r in plan.reuse:
            if r.first == k:
                inner.emit(f"{r.name}[{slot}] = {inner.value(r.expr)};")
        self.values = saved
        for d in range(max(depth, 1)):
            outer.emit("  " * (max(depth, 1) - 1 - d) + "}")
            if self._tiles and d == 1:  # the lanes and the block's iterations are closed
                params = {x: self.rename.get(x, x) for x in self._tiles}
                write_block(outer, "  " * len(loop_syms), loop_syms[-1], osyms[-1], self.lanes,
                            self._tiles, params)
        self._tiles = {}
        if unroll > 1:
            R.combine(outer, self.lanes, reds, sets)
        if plan.split and isyms and reds:
            R.gather(self, outer, reds, accs)
        self._guard = plan.split
        for n in reds:
            R.finish(self, outer, n, accs[n.name], osyms)
        self._guard = False
        if loop.barrier:
            outer.emit("#pragma omp barrier")  # other threads stored some of what they read

    def open_lanes(self, body: Body, ind: str, simd: bool) -> None:
        last = self.plan.osyms[-1].name
        if simd:
            body.emit(ind + "#pragma omp simd")
        body.emit(f"{ind}for (int64_t j = 0; j < {self.lanes}; ++j) {{")
        body.emit(f"{ind}  const int64_t {last} = lane0 + j;")

    def _pointwise(self, body: Body, n: ComputeNode, osyms, isyms, expr=None) -> None:
        v = body.value(self.exprs[n.name] if expr is None else expr)
        b = self.k.layout(n.name, self.g)
        index = ir.linear(osyms + isyms, b.stride)
        if n.name in self.k.scratch:
            body.emit(f"{n.name}_s[{self._scratch_slot(body, n.name, index)}] = {v};")
        elif n.name in self._tiles:
            self.params[self.rename.get(n.name, n.name)] = True
            body.emit(f"{n.name}_t[{TILE_ROW}][j] = {stored(n.dtype, v)};")
        elif n.name not in self.k.local:
            self.store(body, n, body.index(index), v)
        self.values[n.name] = v

    def _scatter(self, body: Body, n: ComputeNode) -> None:
        out = self.g.buffers[n.name]
        osyms = self.syms.ranges("s", n.shape)
        _nest(body, osyms, n.shape, parallel=self.plan.parallel)
        inner = Body(self, body.indent + "  " * (len(osyms) + 1))
        inner.lines = body.lines
        v = inner.value(n.init(osyms))
        self.store(inner, n, index_code(ir.linear(osyms, out.stride)), v)
        _close(body, len(osyms))
        vsyms = self.syms.ranges("v", n.rshape)
        _nest(body, vsyms, n.rshape, parallel=False)
        inner = Body(self, body.indent + "  " * (len(vsyms) + 1))
        inner.lines = body.lines
        v = inner.value(n.fn(vsyms))
        self.store(inner, n, inner.index(n.index(vsyms)), v,
                   "+=" if n.reduce_op == "add" else "=")
        _close(body, len(vsyms))


def _nest(body: Body, syms, shape, parallel: bool) -> None:
    if not syms:
        body.emit("{")
        return
    if parallel:
        body.emit("#pragma omp parallel for")
    for d, (s, size) in enumerate(zip(syms, shape)):
        body.emit(f"{'  ' * d}for (int64_t {s.name} = 0; {s.name} < {size}; ++{s.name}) {{")


def _close(body: Body, depth: int) -> None:
    for d in range(max(depth, 1)):
        body.emit("  " * (max(depth, 1) - 1 - d) + "}")


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def print_kernel(kern: Kernel, plan: KernelPlan, g: LoweredGraph) -> KernelSource:
    """The C++ function of kernel `kern` as its plan says, and its parameter buffers."""
    return KernelPrinter(kern, plan, g).source()


def kernel_source(kern: Kernel, g: LoweredGraph) -> tuple[str, list[str]]:
    """The kernel's C++ function and its parameter buffers, in order (planned here)."""
    src = print_kernel(kern, plan_kernel(kern, g), g)
    return src.code, list(src.params)
