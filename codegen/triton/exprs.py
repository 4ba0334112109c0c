"""Loop-IR expressions -> Triton statements: one variable per distinct sub-expression.

Values compute in float32 for bfloat16/float16 (float64 stays float64); low precision rounds
only where the IR casts or stores. Each variable records which tile axes it varies along.
"""
from __future__ import annotations

import math
import os
from typing import Optional

import sympy
import torch

from trainc.codegen import ir
from trainc.codegen.symbols import Indirect

TL = {torch.float32: "tl.float32", torch.float64: "tl.float64", torch.bfloat16: "tl.bfloat16",
      torch.float16: "tl.float16", torch.int64: "tl.int64", torch.int32: "tl.int32",
      torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8",
      torch.bool: "tl.int1"}


def compute(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def tl_compute(dtype: torch.dtype) -> str:
    return TL[compute(dtype)]


def literal(value, dtype: torch.dtype) -> str:
    """A Python literal Triton parses as a constant (inf/nan spelled through 1e999)."""
    if dtype == torch.bool:
        return "1" if value else "0"
    if not dtype.is_floating_point:
        return str(int(value))
    v = float(value)
    if math.isnan(v):
        return "float('nan')"
    if math.isinf(v):
        return "1e999" if v > 0 else "-1e999"
    return repr(v)


TRITON_INDEX = ir.IndexSyntax(floordiv="//", minimum="tl.minimum", maximum="tl.maximum",
                              integer=str, backend="triton")


def index_code(e) -> str:
    return ir.print_index(e, TRITON_INDEX)


_INFIX = {"add": "+", "sub": "-", "mul": "*", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
          "eq": "==", "ne": "!=", "and": "&", "or": "|", "xor": "!=", "bitwise_and": "&",
          "bitwise_or": "|", "bitwise_xor": "^", "lshift": "<<", "rshift": ">>"}
_TL = {"exp": "tl.exp", "exp2": "tl.exp2", "log": "tl.log", "log2": "tl.log2", "sin": "tl.sin",
       "cos": "tl.cos", "floor": "tl.floor", "ceil": "tl.ceil", "abs": "tl.abs", "erf": "tl.erf",
       "rsqrt": "tl.rsqrt"}
# Written with tl primitives in the prelude: they also run under TRITON_INTERPRET.
_PRELUDE_FN = {"expm1": "_expm1", "log1p": "_log1p", "tanh": "_tanh", "trunc": "_trunc",
               "round": "_nearbyint"}
_LIBDEVICE = {"tan", "erfc", "atan", "asin", "acos", "sinh", "cosh", "pow"}
# have prelude stand-ins (_ipow, ...)
_INTERPRETED = {"pow", "tan", "sinh", "cosh", "erfc", "atan", "asin", "acos"}
# ops whose result jumps where their argument crosses a value: a division feeding one directly
# is IEEE-rounded even when Config.triton_precise_div is off
_STEPS = {"floor", "ceil", "trunc", "round", "lt", "le", "gt", "ge", "eq", "ne"}
_POW = {2.0: "({a} * {a})", 3.0: "({a} * {a} * {a})", 1.0: "{a}", 0.5: "tl.sqrt_rn({a})",
        -1.0: "(1.0 / {a})", -0.5: "tl.rsqrt({a})", -2.0: "(1.0 / ({a} * {a}))"}


def exact_reciprocal(c) -> Optional[float]:
    """1/c when c is a power of two whose reciprocal float32 holds exactly (then x / c and
    x * (1/c) are the same correctly rounded value for every x), else None."""
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c == 0:
        return None
    m, e = math.frexp(abs(c))  # c = m * 2**e: a power of two when m is 1/2, 1/c = 2**(1 - e)
    # float32 holds 2**k exactly for -149 <= k <= 127 (subnormals included)
    return 1.0 / c if m == 0.5 and -149 <= 1 - e <= 127 else None


def op_code(e: ir.Op, a: list[str], dts: list[torch.dtype], precise_div: bool = True) -> str:
    """`precise_div`: float32 division IEEE-rounded (tl.div_rn) rather than Triton's `/`
    (div.full.f32: full range, within 2 ulp; Config.triton_precise_div)."""
    n, t = e.name, tl_compute(e.dtype)
    ieee = e.dtype == torch.float32 and precise_div
    fp = e.dtype.is_floating_point
    if n in _INFIX:
        return f"({a[0]} {_INFIX[n]} {a[1]})"
    if n in _TL:
        return f"{_TL[n]}({a[0]})"
    if n == "tanh" and not _interpreting():
        return f"libdevice.tanh({a[0]})"
    if n in _PRELUDE_FN:
        return f"{_PRELUDE_FN[n]}({a[0]})"
    if n == "pow" and isinstance(e.args[1], ir.Const) and fp and float(e.args[1].value) in _POW:
        k = float(e.args[1].value)
        if ieee and k in (-1.0, -2.0):  # x ** -1, x ** -2: divisions
            one = "tl.full([1], 1.0, tl.float32)"
            return f"tl.div_rn({one}, {a[0] if k == -1.0 else f'({a[0]} * {a[0]})'})"
        code = _POW[k].format(a=a[0])
        return code.replace("sqrt_rn", "sqrt") if e.dtype != torch.float32 else code
    if n in _LIBDEVICE:
        # the interpreter has no libdevice: tl-primitive stand-ins from the prelude there
        fn = f"_i{n}" if n in _INTERPRETED and _interpreting() else f"libdevice.{n}"
        return f"{fn}({', '.join(a)})"
    simple = {
        "neg": lambda: f"(-{a[0]})", "not": lambda: f"({a[0]} == 0)",
        "bitwise_not": lambda: f"(~{a[0]})" if e.dtype != torch.bool else f"({a[0]} == 0)",
        "sqrt": lambda: f"tl.sqrt_rn({a[0]})" if e.dtype == torch.float32 else f"tl.sqrt({a[0]})",
        "truediv": lambda: f"tl.div_rn({a[0]}, {a[1]})" if ieee else f"({a[0]} / {a[1]})",
        "reciprocal": lambda: f"tl.div_rn(tl.full([1], 1.0, tl.float32), {a[0]})" if ieee
        else f"(1.0 / {a[0]})",
        "sigmoid": lambda: f"(1.0 / (1.0 + tl.exp(-{a[0]})))",
        "where": lambda: f"tl.where({a[0]}, {a[1]}, {a[2]})",
        "isnan": lambda: f"({a[0]} != {a[0]})",
        "isinf": lambda: f"(tl.abs({a[0]}) == 1e999)" if dts[0].is_floating_point
        else f"({a[0]} != {a[0]})",
        "sign": lambda: f"_sign({a[0]})",
        "philox_uniform": lambda: f"tl.rand({a[0]}, {a[1]}.to(tl.uint32))",
        "cast": lambda: cast_code(a[0], dts[0], e.dtype),
    }
    if n in simple:
        return simple[n]()
    if n in ("maximum", "minimum"):
        f = "tl.maximum" if n == "maximum" else "tl.minimum"
        return f"{f}({a[0]}, {a[1]}, propagate_nan=tl.PropagateNan.ALL)" if fp \
            else f"{f}({a[0]}, {a[1]})"
    if n == "floordiv":
        return f"tl.floor(tl.div_rn({a[0]}, {a[1]}))" if e.dtype == torch.float32 else \
            f"tl.floor({a[0]} / {a[1]})" if fp else f"_floordiv({a[0]}, {a[1]})"
    if n == "remainder":
        if not fp:
            return f"_mod({a[0]}, {a[1]})"
        q = f"tl.div_rn({a[0]}, {a[1]})" if e.dtype == torch.float32 else f"({a[0]} / {a[1]})"
        return f"({a[0]} - {a[1]} * tl.floor({q}))"
    raise NotImplementedError(f"trainc triton: op {n}")


def cast_code(x: str, src: torch.dtype, dst: torch.dtype) -> str:
    if dst == torch.bool:
        return f"({x} != 0)"
    if dst in (torch.bfloat16, torch.float16):  # round now, keep computing in float32
        if src == torch.bool:  # 0/1 are exact in float32; the interpreter mis-casts i1 -> bf16
            return f"{x}.to(tl.float32)"
        return widen(to_dtype(x, src, dst), dst)
    return f"{x}.to({TL[dst]})"


def widen(x: str, dtype: torch.dtype) -> str:
    """A bfloat16/float16 value as float32. Under the interpreter bfloat16 goes by its bits
    (_bf16_f32): the interpreter's own cast gets subnormals wrong (1e-38 read as 8.3e-39)."""
    if dtype == torch.bfloat16 and _interpreting():
        return f"_bf16_f32({x})"
    return f"{x}.to(tl.float32)"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def to_dtype(x: str, src: torch.dtype, dst: torch.dtype) -> str:
    """x (computed in compute(src)) converted to dst. Native Triton rounds float32 -> bfloat16
    to nearest even; its interpreter truncates, so under it the rounding is spelled out
    (_rne_bf16) and CPU tests see the values the GPU computes. float64 goes to 16 bits through
    float32, as eager converts (c10's 16-bit types are made from float; the interpreter's direct
    float64 -> bfloat16 cast returns 0)."""
    if dst in (torch.bfloat16, torch.float16) and src == torch.float64:
        return to_dtype(f"{x}.to(tl.float32)", torch.float32, dst)
    if dst == torch.bfloat16 and compute(src) == torch.float32 and _interpreting():
        return f"_rne_bf16({x})"
    return f"{x}.to({TL[dst]})"


class Body:
    """Prints expressions as statements; `memo` maps Expr -> variable, `axes` variable -> axes."""

    def __init__(self, printer, indent: str, parent: Optional["Body"] = None):
        self.p, self.indent = printer, indent
        self.lines: list[str] = parent.lines if parent else []
        self.memo: dict = dict(parent.memo) if parent else {}
        self.defined: set = set(parent.defined) if parent else set()

    def child(self) -> "Body":
        return Body(self.p, self.indent + "    ", self)

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line)

    def value(self, e: ir.Expr) -> str:
        if e in self.memo:
            return self.memo[e]
        if isinstance(e, ir.Const):
            name = self.p.const(e)
        else:
            name = self.p.tmp()
            self.emit(f"{name} = {self._code(e)}")
            self.p.axes[name] = self.axes_of(e)
        self.memo[e] = name
        return name

    def axes_of(self, e) -> frozenset:
        """The tile axes ("x", "r") a value or index expression varies along."""
        if isinstance(e, ir.Expr):
            out = frozenset()
            for x in ir.walk(e):
                if isinstance(x, ir.Load):
                    out |= self.axes_of(x.index)
                elif isinstance(x, ir.IndexValue):
                    out |= self.axes_of(x.expr)
            return out
        out = frozenset()
        for s in sympy.sympify(e).free_symbols:
            if isinstance(s, Indirect):
                out |= self.axes_of(s.value)
            else:
                out |= self.p.sym_axes.get(s, frozenset())
        return out

    def index(self, e) -> str:
        for s in sorted(sympy.sympify(e).free_symbols, key=lambda s: s.name):
            if isinstance(s, Indirect) and s not in self.defined:
                self.p.syms.define(s)
                v = self.value(s.value)
                self.emit(f"{s.name} = tl.where({v} < 0, {v} + {s.size}, {v})")
                self.defined.add(s)
        return index_code(e)

    def _code(self, e: ir.Expr) -> str:
        if isinstance(e, ir.IndexValue):
            expr = sympy.sympify(e.expr)
            if expr.is_Integer:  # a size-1 range: a Python int has no .to(), use a constant
                return self.p.const(ir.Const(int(expr), e.dtype))
            return f"({self.index(expr)}).to({tl_compute(e.dtype)})"
        if isinstance(e, ir.Load):
            return self.p.load(self, e)
        if e.name in _STEPS or (e.name == "cast" and not e.dtype.is_floating_point):
            # a quotient rounded to an integer or compared: an ulp off can move it a whole step
            self.p.exact_divs.update(x for x in e.args if isinstance(x, ir.Op))
        if e.name == "truediv" and isinstance(e.args[1], ir.Const):
            r = exact_reciprocal(e.args[1].value) if e.dtype.is_floating_point and \
                e.args[0].dtype.is_floating_point else None
            if r is not None:  # x / 2^k == x * 2^-k, bit for bit: one multiply, no division
                return f"({self.value(e.args[0])} * {self.p.const(ir.Const(r, e.dtype))})"
            # a mean (sum / n) as eager rounds it: the mean of equal values is that value, which
            # ties in a later max/min and its backward depend on (reductions._divide)
            self.p.exact_divs.add(e)
        a = [self.value(x) for x in e.args]
        return op_code(e, a, [x.dtype for x in e.args],
                       self.p.precise_div or e in self.p.exact_divs)
