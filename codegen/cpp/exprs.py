"""C++ spelling of loop-IR values: types, constants, index expressions, ops, and `Body`, which
prints an expression tree as one `const` temporary per distinct sub-expression.

Values compute in float for float32/bfloat16/float16 (double for float64); bfloat16 and
float16 round only when stored or explicitly cast.
"""
from __future__ import annotations

import math

import sympy
import torch

from trainc.codegen import ir
from trainc.codegen.cpp.narrow import KEEPS_NARROW, is_narrow
from trainc.codegen.symbols import Indirect

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
    """Prints expressions into a list of statements, one temporary per distinct sub-expression.
    `printer` (codegen/cpp/printer.py) names temporaries (tmp), spells loads (load), and keeps
    the kernel's symbol scope (syms) and int32 values (narrow, narrow_names)."""

    def __init__(self, printer, indent: str):
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


def stored(dt: torch.dtype, v: str) -> str:
    """v converted to dtype's storage type."""
    if dt == torch.bfloat16:
        return f"f2bf({v})"
    if dt == torch.float16:
        return f"(_Float16)({v})"
    return f"({STORAGE[dt]})({v})"
