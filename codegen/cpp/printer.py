"""Schedule kernels -> C++ source: OpenMP-parallel outer loop, `omp simd` innermost loops.

Values compute in float for float32/bfloat16/float16 (double for float64); bfloat16 and
float16 round only when stored or explicitly cast. Every pointer is __restrict__.
"""
from __future__ import annotations

import math

import sympy
import torch

from trainc.codegen import ir
from trainc.codegen.graph import ComputeNode, LoweredGraph
from trainc.codegen.cpp.hoist import plan_hoists
from trainc.codegen.cpp.lanes import choose_lanes, flatten_loop
from trainc.codegen.cpp.narrow import KEEPS_NARROW, is_narrow
from trainc.codegen.cpp.reuse import plan_reuse
from trainc.codegen.cpp.threads import gather_partials, split_for, split_threads_header
from trainc.codegen.cpp.transpose import ROW as TILE_ROW
from trainc.codegen.cpp.transpose import open_block, tiled_stores, write_block
from trainc.codegen.scheduler import Kernel, Loop, within_outer
from trainc.codegen.symbols import Indirect, Symbols

PARALLEL_WORK = 32768  # elements a kernel must touch before OpenMP threads pay off
SCRATCH_BYTES = 16384  # per kernel-internal buffer and outer iteration: stays in L1/L2
MIN_INNER = 512  # elements a pointwise kernel's inner loops cover (flattened when contiguous)

STORAGE = {torch.float32: "float", torch.float64: "double", torch.bfloat16: "uint16_t",
           torch.float16: "_Float16", torch.int64: "int64_t", torch.int32: "int32_t",
           torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t",
           torch.bool: "uint8_t"}  # bool as bytes: GCC vectorizes uint8 loads, not bool ones


def ctype(dtype: torch.dtype) -> str:
    """The C type a value of `dtype` computes in."""
    if dtype in (torch.float32, torch.bfloat16, torch.float16):
        return "float"
    return "bool" if dtype == torch.bool else STORAGE[dtype]


CPP_INDEX = ir.IndexSyntax(
    floordiv="/", minimum="std::min<int64_t>", maximum="std::max<int64_t>",
    integer=lambda v: f"{v}LL" if abs(v) > 2**31 - 1 else str(v), backend="cpp")


def index_code(e) -> str:
    return ir.print_index(e, CPP_INDEX)


def const_code(value, dtype: torch.dtype) -> str:
    t = ctype(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if not dtype.is_floating_point:
        return f"(({t}){int(value)}LL)"
    if math.isnan(value):
        return f"std::numeric_limits<{t}>::quiet_NaN()"
    if math.isinf(value):
        return f"{'-' if value < 0 else ''}std::numeric_limits<{t}>::infinity()"
    return f"(({t}){float(value)!r})"


_INFIX = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "lt": "<", "le": "<=",
          "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||",
          "xor": "!=", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^",
          "lshift": "<<", "rshift": ">>"}
_CALL = {"exp": "tc_exp", "exp2": "std::exp2", "expm1": "std::expm1", "log": "std::log",
         "log2": "std::log2", "log1p": "std::log1p", "sqrt": "std::sqrt", "sin": "std::sin",
         "cos": "std::cos", "tan": "std::tan", "tanh": "tc_tanh", "erf": "tc_erf",
         "erfc": "std::erfc", "atan": "std::atan", "asin": "std::asin", "acos": "std::acos",
         "sinh": "std::sinh", "cosh": "std::cosh", "floor": "std::floor", "ceil": "std::ceil",
         "trunc": "std::trunc", "round": "std::nearbyint", "pow": "std::pow",
         "isnan": "std::isnan", "isinf": "std::isinf", "sign": "tc_sign"}


class Body:
    """Prints expressions into a list of statements, one temporary per distinct sub-expression."""

    def __init__(self, printer: "KernelPrinter", indent: str):
        self.p, self.indent = printer, indent
        self.lines: list[str] = []
        self.memo: dict = {}
        self.defined: set = set()

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line)

    def value(self, e: ir.Expr) -> str:
        if e in self.memo:
            return self.memo[e]
        narrow = is_narrow(e, self.p.narrow)
        code = self._code(e, narrow)
        if isinstance(e, ir.Const):
            self.memo[e] = code
            return code
        name = self.p.tmp()
        self.emit(f"const {'int32_t' if narrow else ctype(e.dtype)} {name} = {code};")
        if narrow:
            self.p.narrow_names.add(name)
        self.memo[e] = name
        return name

    def index(self, e) -> str:
        for s in sorted(sympy.sympify(e).free_symbols, key=lambda s: s.name):
            if isinstance(s, Indirect) and s not in self.defined:
                self.p.syms.define(s)
                v = self.value(s.value)
                self.emit(f"const int64_t {s.name} = {v} < 0 ? {v} + {s.size} : {v};")
                self.defined.add(s)
        return index_code(e)

    def _code(self, e: ir.Expr, narrow: bool = False) -> str:
        if isinstance(e, ir.Const):
            return const_code(e.value, e.dtype)
        if isinstance(e, ir.IndexValue):
            return f"(({'int32_t' if narrow else ctype(e.dtype)}){self.index(e.expr)})"
        if isinstance(e, ir.Load):
            return self.p.load(self, e)
        a = [self.value(x) for x in e.args]
        return op_code(e, self._operands(e, a), [x.dtype for x in e.args])

    def _operands(self, e: ir.Op, a: list[str]) -> list[str]:
        """Operands as e reads them: int32 values (codegen/cpp/narrow.py) stay int32 in selects and
        comparisons, with int64 constants beside them spelled int32; anything else widens them."""
        narrow = self.p.narrow_names
        if e.name not in KEEPS_NARROW:
            return [f"((int64_t){s})" if s in narrow else s for s in a]
        if not any(s in narrow for s in a):
            return a
        small = [isinstance(x, ir.Const) and is_narrow(x, self.p.narrow) for x in e.args]
        return [f"((int32_t){int(x.value)})" if c else s for x, s, c in zip(e.args, a, small)]


def op_code(e: ir.Op, a: list[str], dts: list[torch.dtype]) -> str:
    n, t = e.name, ctype(e.dtype)
    fp = e.dtype.is_floating_point
    if n in _INFIX:
        return f"({a[0]} {_INFIX[n]} {a[1]})"
    if n in _CALL:
        return f"{_CALL[n]}({', '.join(a)})"
    simple = {
        "neg": f"(-{a[0]})", "not": f"(!{a[0]})", "bitwise_not": f"(~{a[0]})"
        if e.dtype != torch.bool else f"(!{a[0]})",
        "abs": f"std::abs({a[0]})", "reciprocal": f"(({t})1 / {a[0]})",
        "rsqrt": f"(({t})1 / std::sqrt({a[0]}))",
        "sigmoid": f"(({t})1 / (({t})1 + tc_exp(-{a[0]})))",
        "where": f"({a[0]} ? {a[1]} : {a[2]})" if len(a) == 3 else "",
        "philox_uniform": f"philox_uniform({a[0]}, {a[1]})" if len(a) == 2 else "",
    }
    if n in simple:
        return simple[n]
    if n in ("maximum", "minimum"):
        f = "tc_max" if n == "maximum" else "tc_min"
        return f"{f}<{t}>({a[0]}, {a[1]})"
    if n == "floordiv":
        return f"std::floor({a[0]} / {a[1]})" if fp else f"tc_floordiv<{t}>({a[0]}, {a[1]})"
    if n == "remainder":
        return f"tc_fmod_py({a[0]}, {a[1]})" if fp else f"tc_mod<{t}>({a[0]}, {a[1]})"
    if n == "cast":
        return cast_code(a[0], dts[0], e.dtype)
    raise NotImplementedError(f"trainc cpp: op {n}")


def cast_code(x: str, src: torch.dtype, dst: torch.dtype) -> str:
    if dst == torch.bool:
        return f"({x} != 0)"
    if dst == torch.bfloat16:
        return f"round_bf16((float){x})"
    if dst == torch.float16:
        return f"round_f16((float){x})"
    return f"(({ctype(dst)}){x})"


class KernelPrinter:
    def __init__(self, kern: Kernel, g: LoweredGraph):
        self.k, self.g = kern, g
        self.syms = g.symbols.kernel(kern.name)  # this kernel's own: its source is its own
        self.params: dict[str, bool] = {}  # buffer -> written
        self.values: dict[str, str] = {}  # buffer -> C var holding its value here
        # every node's value expression, built once: the lane choice and the printer share it
        self.osyms = self.syms.ranges("o", kern.outer) if kern.kind == "loops" else []
        # per loop: its loop symbols, the index expression of each inner dim, its extents
        plain: dict[tuple, list] = {}
        self.shapes = [flatten_loop(lp, self.osyms, g, kern.local,
                                    plain.setdefault(tuple(lp.inner),
                                                     self.syms.ranges("i", lp.inner)),
                                    self.syms, kern.layouts)
                       for lp in kern.loops]
        self.exprs = {} if kern.kind != "loops" else {
            n.name: n.fn(self.osyms + dims) if n.kind == "pointwise" else n.fn(self.osyms, dims)
            for lp, (_, dims, _) in zip(kern.loops, self.shapes) for n in lp.steps}
        # vector lanes along the last outer dim instead of the innermost loop (column
        # reductions, kernels contiguous in an outer dim); None: vectorize the inner loop
        self.lanes = choose_lanes(kern, g, self.osyms, [s[0] for s in self.shapes],
                                  [s[1] for s in self.shapes], self.exprs)
        self.reuse = [] if self.lanes or kern.kind != "loops" else plan_reuse(
            [[self.exprs[n.name] for n in lp.steps] for lp in kern.loops],
            [s[2] for s in self.shapes], [s[0] for s in self.shapes])
        self._tmp = 0
        self.narrow: dict = {}  # expr -> computed in int32 (codegen/cpp/narrow.py)
        self.narrow_names: set[str] = set()  # the C variables holding such values
        # an in-place result is stored into the buffer it overwrites (codegen/storage.py):
        # one pointer, so __restrict__ stays true
        self.rename = {n.name: g.storage[n.name] for n in kern.nodes if n.name in g.storage}
        self._consts: dict[str, str] = {}  # load text -> name, read once before the loops
        written = {n.name for n in kern.nodes} | set(self.rename.values()) | set(kern.scratch)
        self.written = written
        self.tiny = [self._tiny_inner(k) for k in range(len(kern.loops))]
        dims = [self._vector_dim(k) for k in range(len(kern.loops))]
        self.hoists = [] if kern.kind != "loops" else plan_hoists(
            [[self.exprs[n.name] for n in lp.steps] for lp in kern.loops],
            [v for v, _ in dims], [n for _, n in dims], written)
        self._fills: list[str] = []
        self.split = self._thread_split()
        self._parts: list[str] = []  # shared partial arrays of a thread split
        self._acc_types: dict[str, str] = {}
        self._guard = False  # stores only from thread 0 (values every thread holds)
        self._tiles: dict[str, str] = {}  # node -> store index, stored through a tile here

    def _vector_dim(self, k: int) -> tuple:
        """(symbol, extent) of the index loop k vectorizes along; (None, 0) if none."""
        if self.lanes:
            return self.osyms[-1], int(self.k.outer[-1])
        isyms, _, extents = self.shapes[k]
        if self.tiny[k]:
            return isyms[-2], int(extents[-2])
        return (isyms[-1], int(extents[-1])) if isyms else (None, 0)

    def _tiny_inner(self, k: int) -> int:
        """The extent of loop k's innermost dim when it is too short for a vector (an NCHW image of
        3 channels read into NHWC): the printer unrolls it inside a vector loop over the next dim,
        whose loads (or stores) are the contiguous ones; 0 to keep the loop as it is."""
        isyms, _, extents = self.shapes[k]
        if self.lanes or self.reuse or self.k.scratch or len(isyms) < 2 or self.k.kind != "loops":
            return 0
        if any(n.kind != "pointwise" for n in self.k.loops[k].steps):
            return 0
        inner, nxt = int(extents[-1]), int(extents[-2])
        return inner if inner <= TINY_INNER and nxt >= 2 * TINY_INNER else 0

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
        body.emit(f"{'if (tid == 0) ' if self._guard else ''}{target} = {_stored(n.dtype, v)};")

    def index_text(self, e) -> str:
        return index_code(e)

    def _scratch_slot(self, body: Body, buf: str, index) -> str:
        """Where `buf[index]` lives in the buffer's scratch array (lane-major with lanes)."""
        b = self.k.layout(buf, self.g)
        h = within_outer(index, self.osyms, b.stride, b.shape)
        assert h is not None, f"trainc cpp: scratch read of {buf} leaves its outer iteration"
        return f"{body.index(h)} * {self.lanes} + j" if self.lanes else body.index(h)

    # -- kernel ---------------------------------------------------------------------------
    def source(self) -> str:
        osyms = self.osyms
        self._fills = self._hoist_fills()
        body = Body(self, "    ")
        if self.k.kind == "scatter":
            self._scatter(body, self.k.nodes[0])
        else:
            for lp, shape in zip(self.k.loops, self.shapes):
                self._loop(body, lp, osyms, shape)
        return self._wrap(osyms, body)

    def _hoist_fills(self) -> list[str]:
        """Loops computing the hoisted values (codegen/cpp/hoist.py) once, before the kernel's
        parallel loop: one simd loop per vectorized index."""
        groups: dict[tuple, list] = {}
        for h in self.hoists:
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

    def _wrap(self, osyms, body: Body) -> str:
        params = ", ".join(
            f"{'' if w else 'const '}{STORAGE[self.g.buffers[b].dtype]}* __restrict__ {b}"
            for b, w in self.params.items())
        on = _numel(self.k.outer)
        lines = [f'extern "C" void {self.k.name}({params}) {{']
        if on == 0:
            return "\n".join(lines + ["}"])
        lines += [f"  const auto {name} = {x};" for x, name in self._consts.items()]
        lines += self._fills
        w = self.lanes or 1
        if self.split:
            lines += self._parts + split_threads_header()
        if osyms and on > 1:
            if self._work() >= PARALLEL_WORK and not self.split:
                lines.append("  #pragma omp parallel for")
            shape = list(self.k.outer[:-1]) + [self.k.outer[-1] // w]
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
            n = _numel(buf.shape[len(self.k.outer):]) * w
            t = STORAGE[buf.dtype] if buf.dtype == torch.bool else ctype(buf.dtype)
            lines.append(f"    alignas(64) {t} {b}_s[{n}];")
        for r in self.reuse:  # expensive values an earlier loop computed for later ones
            n = _numel(self.shapes[r.first][2])
            lines.append(f"    alignas(64) {ctype(r.expr.dtype)} {r.name}[{n}];")
        lines += body.lines
        lines += ["  }"] + (["  }"] if self.split else []) + ["}"]
        return "\n".join(lines)

    def _work(self) -> int:
        return sum(_numel(lp.inner) * len(lp.steps) for lp in self.k.loops) * _numel(self.k.outer)

    def _thread_split(self) -> bool:
        """Split reduced dims over threads (codegen/cpp/threads.py): a lanes kernel with one lane
        block, enough work, and only reductions that fold."""
        k = self.k
        if not self.lanes or k.kind != "loops" or k.scratch or self.reuse:
            return False
        if _numel(k.outer) // self.lanes != 1 or self._work() < PARALLEL_WORK:
            return False
        return all(n.kind == "pointwise" or n.reduce_op in _COMBINE
                   for lp in k.loops for n in lp.steps)

    def _loop(self, outer: Body, lp: Loop, osyms, shape) -> None:
        isyms, dims, extents = shape
        reds = [n for n in lp.steps if n.kind == "reduction"]
        unroll = self._unroll(lp, isyms, extents)
        sets = [{n.name: self._acc_init(outer, n) for n in reds} for _ in range(unroll)]
        accs = sets[0]
        simd = not any(n.reduce_op in ("argmax", "argmin") for n in reds)
        k = self.k.loops.index(lp)
        tiny = self.tiny[k]
        loop_syms, loop_extents = list(isyms), list(extents)
        if tiny:  # the innermost dim is unrolled below
            loop_syms, loop_extents = loop_syms[:-1], loop_extents[:-1]
        if unroll > 1:  # the innermost reduced dim runs `unroll` iterations per trip
            loop_extents[-1] = int(extents[-1]) // unroll
            loop_syms[-1] = self.syms.range("i", loop_extents[-1])
        self._tiles = tiled_stores(self, lp, osyms, loop_syms, loop_extents, dims, unroll, tiny)
        for d, (s, size) in enumerate(zip(loop_syms, loop_extents)):
            if d == len(loop_syms) - 1 and simd and not self.lanes:
                outer.emit(_simd_pragma(reds, accs))
            if self._tiles and d == len(loop_syms) - 1:
                types = {x: STORAGE[self.g.buffers[x].dtype] for x in self._tiles}
                open_block(outer, "  " * d, s, size, self._tiles, types)
                continue
            head = split_for(s.name, size) if self.split and d == 0 else \
                f"for (int64_t {s.name} = 0; {s.name} < {size}; ++{s.name}) {{"
            outer.emit("  " * d + head)
        self._guard = self.split and not isyms  # every thread runs the whole loop
        depth = len(loop_syms) + (1 if self._tiles else 0)  # a tiled loop runs in blocks
        if self.lanes:  # innermost: the lanes of the last outer dim, independent accumulators
            self._open_lanes(outer, "  " * depth, simd)
            depth += 1
        elif not isyms:
            outer.emit("{")
        inner = Body(self, outer.indent + "  " * (max(depth, 1) + 1))
        inner.lines = outer.lines
        slot = index_code(ir.linear(isyms, ir.contiguous_strides(extents))) if isyms else "0"
        for r in self.reuse:
            if k in r.later:
                inner.memo[r.expr] = f"{r.name}[{slot}]"
        v = self._vector_dim(k)
        for h in self.hoists:
            if (h.sym, h.extent) == v:
                inner.memo[h.expr] = f"{h.name}[{h.sym.name}]"
        saved = dict(self.values)
        for g, acc_set in enumerate(sets if unroll > 1 else []):
            sub = {isyms[-1]: unroll * loop_syms[-1] + g}
            gdims = [sympy.sympify(d).subs(sub) for d in dims]
            for n in lp.steps:
                self._accumulate(inner, n, acc_set[n.name], n.fn(osyms, gdims), isyms, lp.inner)
        for g in range(tiny):
            gdims = [sympy.sympify(d).subs({isyms[-1]: g}) for d in dims]
            for n in lp.steps:
                self._pointwise(inner, n, osyms, gdims, n.fn(osyms + gdims))
        for n in lp.steps if unroll == 1 and not tiny else []:
            if n.kind == "pointwise":
                self._pointwise(inner, n, osyms, dims)
            else:
                self._accumulate(inner, n, accs[n.name], self.exprs[n.name], isyms, lp.inner)
        for r in self.reuse:
            if r.first == k:
                inner.emit(f"{r.name}[{slot}] = {inner.value(r.expr)};")
        self.values = saved
        for d in range(max(depth, 1)):
            outer.emit("  " * (max(depth, 1) - 1 - d) + "}")
            if self._tiles and d == 1:  # the lanes and the block's iterations are closed
                params = {x: self.rename.get(x, x) for x in self._tiles}
                write_block(outer, "  " * len(loop_syms), loop_syms[-1], osyms[-1],
                            self._tiles, params)
        self._tiles = {}
        if unroll > 1:
            self._combine(outer, reds, sets)
        if self.split and isyms and reds:
            self._gather(outer, reds, accs)
        self._guard = self.split
        for n in reds:
            self._finish(outer, n, accs[n.name], osyms)
        self._guard = False
        if self.split and self._read_later(lp):
            outer.emit("#pragma omp barrier")  # other threads stored some of what they read

    def _read_later(self, lp: Loop) -> bool:
        """Does a later loop load a pointwise result this loop stored? (Reduction results reach
        later loops as values, not through memory.)"""
        stored = {n.name for n in lp.steps if n.kind == "pointwise"}
        later = self.k.loops[self.k.loops.index(lp) + 1:]
        return any(x.buf in stored for q in later for n in q.steps
                   for x in ir.loads(self.exprs[n.name]))

    def _gather(self, body: Body, reds, accs) -> None:
        """Every thread's partial accumulators, folded in thread order into each thread's."""
        vars_ = [(self._acc_types[a[:-3]], a[:-3], c) for n in reds
                 for a, c in zip(accs[n.name], _COMBINE[n.reduce_op])]
        decls, lines = gather_partials(vars_, self.lanes)
        self._parts += decls
        for line in lines:
            body.emit(line)

    def _unroll(self, lp: Loop, isyms, extents) -> int:
        """Accumulator sets for a lanes reduction loop: one set of fewer than UNROLL_LANES lanes
        is a chain of dependent vector adds, latency-bound (NHWC batch-norm statistics of 16
        channels read at half the bandwidth); each set takes every unroll-th trip of the
        innermost reduced dim, and the sets are combined in order afterwards."""
        if not self.lanes or not isyms or self.lanes >= UNROLL_LANES:
            return 1
        if any(n.kind != "reduction" or n.reduce_op not in _COMBINE for n in lp.steps):
            return 1
        k = UNROLL_LANES // self.lanes
        return k if int(extents[-1]) % k == 0 and int(extents[-1]) >= k else 1

    def _combine(self, body: Body, reds, sets) -> None:
        """Fold accumulator sets 1.. into set 0, in set order (deterministic)."""
        body.emit(f"for (int64_t j = 0; j < {self.lanes}; ++j) {{")
        for acc_set in sets[1:]:
            for n in reds:
                for a, b, c in zip(sets[0][n.name], acc_set[n.name], _COMBINE[n.reduce_op]):
                    body.emit("  " + c(a, b))
        body.emit("}")

    def _open_lanes(self, body: Body, ind: str, simd: bool) -> None:
        last = self.osyms[-1].name
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
            body.emit(f"{n.name}_t[{TILE_ROW}][j] = {_stored(n.dtype, v)};")
        elif n.name not in self.k.local:
            self.store(body, n, body.index(index), v)
        self.values[n.name] = v

    def _acc_init(self, body: Body, n: ComputeNode) -> list[str]:
        e_dtype = _expr_dtype(n, self.syms)
        t = ctype(e_dtype)
        acc = self.tmp()
        op = n.reduce_op
        if op in ("sum", "prod"):
            vars_ = [(t, acc, f"{t}({0 if op == 'sum' else 1})")]
        elif op in ("max", "min"):
            # an int flag, not bool: GCC has no vector type for bool and would keep it scalar
            vars_ = [(t, acc, _extreme(e_dtype, op == "max")), ("int", acc + "n", "0")]
        else:
            vars_ = [(t, acc, _extreme(e_dtype, op == "argmax")), ("int64_t", acc + "i", "0")]
        self._acc_types.update((v, ty) for ty, v, _ in vars_)
        if not self.lanes:
            body.emit(" ".join(f"{ty} {v} = {init};" for ty, v, init in vars_))
            return [v for _, v, _ in vars_]
        w = self.lanes
        body.emit(" ".join(f"{ty} {v}[{w}];" for ty, v, _ in vars_) +
                  f" for (int64_t j = 0; j < {w}; ++j) {{ " +
                  " ".join(f"{v}[j] = {init};" for _, v, init in vars_) + " }")
        return [f"{v}[j]" for _, v, _ in vars_]

    def _accumulate(self, body: Body, n: ComputeNode, acc, e, isyms, inner) -> None:
        v = body.value(e)
        op = n.reduce_op
        if op == "sum":
            body.emit(f"{acc[0]} += {v};")
        elif op == "prod":
            body.emit(f"{acc[0]} *= {v};")
        elif op in ("max", "min"):
            cmp = ">" if op == "max" else "<"
            body.emit(f"{acc[0]} = ({v} {cmp} {acc[0]}) ? {v} : {acc[0]}; "
                      f"{acc[1]} |= ({v} != {v});")
        else:
            cmp = ">" if op == "argmax" else "<"
            flat = index_code(ir.linear(isyms, ir.contiguous_strides(inner)))
            body.emit(f"if (({v} {cmp} {acc[0]}) || ({v} != {v} && {acc[0]} == {acc[0]})) "
                      f"{{ {acc[0]} = {v}; {acc[1]} = {flat}; }}")

    def _finish(self, body: Body, n: ComputeNode, acc, osyms) -> None:
        final = self.tmp()
        t = ctype(_expr_dtype(n, self.syms))
        if n.reduce_op in ("max", "min"):
            nan = f"std::numeric_limits<{t}>::quiet_NaN()" if t in ("float", "double") else acc[0]
            value = f"{acc[1]} ? {nan} : {acc[0]}"
        elif n.reduce_op in ("argmax", "argmin"):
            t, value = "int64_t", acc[1]
        else:
            value = acc[0]
        dt = self.g.buffers[n.name].dtype
        if dt in (torch.bfloat16, torch.float16):  # later steps read it as stored: rounded
            value = cast_code(value, dt, dt)
        if self.lanes:
            body.emit(f"{t} {final}[{self.lanes}];")
            self._open_lanes(body, "", True)
            body.emit(f"  {final}[j] = {value};")
            final += "[j]"
        else:
            body.emit(f"const {t} {final} = {value};")
        self.values[n.name] = final
        if n.name not in self.k.local:
            b = self.k.layout(n.name, self.g)
            self.store(body, n, index_code(ir.linear(osyms, b.stride)), final)
        if self.lanes:
            body.emit("}")

    def _scatter(self, body: Body, n: ComputeNode) -> None:
        out = self.g.buffers[n.name]
        osyms = self.syms.ranges("s", n.shape)
        _nest(body, osyms, n.shape, parallel=True)
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
    if parallel and _numel(shape) >= PARALLEL_WORK:
        body.emit("#pragma omp parallel for")
    for d, (s, size) in enumerate(zip(syms, shape)):
        body.emit(f"{'  ' * d}for (int64_t {s.name} = 0; {s.name} < {size}; ++{s.name}) {{")


def _close(body: Body, depth: int) -> None:
    for d in range(max(depth, 1)):
        body.emit("  " * (max(depth, 1) - 1 - d) + "}")


UNROLL_LANES = 64  # accumulator lanes a lanes reduction loop keeps in flight
TINY_INNER = 4  # innermost pointwise dims this short are unrolled inside the next dim's loop

# how each accumulator variable of a reduction folds b into a (max/min: value, then NaN flag)
_COMBINE = {
    "sum": [lambda a, b: f"{a} += {b};"],
    "prod": [lambda a, b: f"{a} *= {b};"],
    "max": [lambda a, b: f"{a} = ({b} > {a}) ? {b} : {a};", lambda a, b: f"{a} |= {b};"],
    "min": [lambda a, b: f"{a} = ({b} < {a}) ? {b} : {a};", lambda a, b: f"{a} |= {b};"],
}


def _stored(dt: torch.dtype, v: str) -> str:
    """v converted to dtype's storage type."""
    if dt == torch.bfloat16:
        return f"f2bf({v})"
    if dt == torch.float16:
        return f"(_Float16)({v})"
    return f"({STORAGE[dt]})({v})"


def _simd_pragma(reds, accs) -> str:
    clauses = []
    for n in reds:
        a = accs[n.name]
        if n.reduce_op == "sum":
            clauses.append(f"reduction(+:{a[0]})")
        elif n.reduce_op == "prod":
            clauses.append(f"reduction(*:{a[0]})")
        else:
            clauses.append(f"reduction({'max' if n.reduce_op == 'max' else 'min'}:{a[0]}) "
                           f"reduction(|:{a[1]})")
    return "#pragma omp simd " + " ".join(clauses)


def _expr_dtype(n: ComputeNode, syms: Symbols) -> torch.dtype:
    return n.fn(syms.ranges("c", n.shape), syms.ranges("c", n.rshape)).dtype


def _extreme(dtype: torch.dtype, lowest: bool) -> str:
    t = ctype(dtype)
    if dtype == torch.bool:
        return "false" if lowest else "true"
    if dtype.is_floating_point:
        return f"{'-' if lowest else ''}std::numeric_limits<{t}>::infinity()"
    return f"std::numeric_limits<{t}>::{'lowest' if lowest else 'max'}()"


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def kernel_source(kern: Kernel, g: LoweredGraph) -> tuple[str, list[str]]:
    """The kernel's C++ function and its parameter buffers, in order."""
    p = KernelPrinter(kern, g)
    return p.source(), list(p.params)
