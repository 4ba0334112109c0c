"""The loop-level IR: backend-neutral value expressions over sympy index expressions.

A tensor value is `TensorValue(shape, dtype, fn)` with `fn(index) -> Expr`; views compose
index functions, so they never copy. Index symbols (codegen/symbols.py) carry their ranges.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import sympy
import torch

from trainc.codegen.symbols import Indirect, Range

Index = sympy.Expr


class FloorDiv(sympy.Function):
    """Floor division of non-negative integer index expressions."""
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        return _split_div(a, b, want_mod=False)


class ModIndex(sympy.Function):
    """a mod b for non-negative integer index expressions."""
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        return _split_div(a, b, want_mod=True)


def _split_div(a, b, want_mod: bool):
    """(q*b + r) // b == q and (q*b + r) % b == r when 0 <= r < b: keeps index math affine."""
    if not b.is_Integer:
        return None
    multiple, rest = [], []
    for t in sympy.Add.make_args(a):
        coeff = t.as_coeff_Mul()[0]
        (multiple if coeff.is_Integer and int(coeff) % int(b) == 0 else rest).append(t)
    if not multiple:
        lo, hi = bounds(a)
        if hi < int(b) and (lo >= 0 or len(rest) == 1):  # already in [0, b): a reshape
            return a if want_mod else sympy.Integer(0)
        return None
    r = sympy.Add(*rest)
    lo, hi = bounds(r)
    if lo < 0 or hi >= int(b):
        return None
    return r if want_mod else sympy.expand(sympy.Add(*multiple) / b)


def bounds(e: sympy.Expr) -> tuple[float, float]:
    """Conservative [lo, hi] of an index expression from the symbols' ranges."""
    if e.is_Integer:
        return int(e), int(e)
    if isinstance(e, Range):
        return 0, e.extent - 1
    if isinstance(e, Indirect):
        return 0, e.size - 1
    if e.is_Symbol:
        return -float("inf"), float("inf")
    if e.is_Add:
        parts = [bounds(a) for a in e.args]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if e.is_Mul:
        lo, hi = 1, 1
        for a in e.args:
            alo, ahi = bounds(a)
            cands = [lo * alo, lo * ahi, hi * alo, hi * ahi]
            cands = [0 if c != c else c for c in cands]  # 0 * inf
            lo, hi = min(cands), max(cands)
        return lo, hi
    if isinstance(e, FloorDiv):
        lo, hi = bounds(e.args[0])
        b = int(e.args[1])
        return (lo // b if lo > -float("inf") else lo), (hi // b if hi < float("inf") else hi)
    if isinstance(e, ModIndex):
        return 0, int(e.args[1]) - 1
    if isinstance(e, (sympy.Min, sympy.Max)):
        parts = [bounds(a) for a in e.args]
        f = min if isinstance(e, sympy.Min) else max
        return f(p[0] for p in parts), f(p[1] for p in parts)
    return -float("inf"), float("inf")


# ---- value expressions ------------------------------------------------------------------

class Expr:
    """Base of value expressions; structural equality with a cached hash (CSE by dict)."""
    __slots__ = ()
    dtype: torch.dtype

    def __hash__(self) -> int:
        h = self.__dict__.get("_h")
        if h is None:
            h = hash((type(self).__name__,) + tuple(
                getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_h", h)
        return h


@dataclass(frozen=True, eq=True)
class Load(Expr):
    buf: str
    index: Index
    dtype: torch.dtype
    __hash__ = Expr.__hash__


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: Union[int, float, bool]
    dtype: torch.dtype
    __hash__ = Expr.__hash__


@dataclass(frozen=True, eq=True)
class IndexValue(Expr):
    """An index expression used as a value (arange, RNG counters, max-pool indices)."""
    expr: Index
    dtype: torch.dtype = torch.int64
    __hash__ = Expr.__hash__


@dataclass(frozen=True, eq=True)
class Op(Expr):
    name: str  # one of OPS
    args: tuple
    dtype: torch.dtype
    __hash__ = Expr.__hash__


# The operator vocabulary every backend's printer implements.
OPS = frozenset("""
add sub mul truediv floordiv remainder neg abs maximum minimum pow
exp exp2 expm1 log log2 log1p sqrt rsqrt sin cos tan tanh sigmoid erf erfc atan asin acos
sinh cosh floor ceil round trunc sign reciprocal isnan isinf
eq ne lt le gt ge and or xor not bitwise_and bitwise_or bitwise_xor bitwise_not
lshift rshift where cast philox_uniform
""".split())


TRANSCENDENTAL = frozenset("""
pow exp exp2 expm1 log log2 log1p sin cos tan tanh sigmoid erf erfc atan asin acos sinh cosh
""".split())


def compute_cost(e: Expr) -> int:
    """What recomputing e costs per element: 1 per arithmetic op, 5 per transcendental."""
    return sum(5 if x.name in TRANSCENDENTAL else 0 if x.name == "cast" else 1
               for x in walk(e) if isinstance(x, Op))


def op(name: str, dtype: torch.dtype, *args: Expr) -> Op:
    assert name in OPS, name
    if name in _COMMUTATIVE and _rank(args[0]) > _rank(args[1]):
        # one spelling for a*b and b*a (IEEE add/mul commute exactly), so that CSE sees that a
        # recomputed forward value and the backward's own formula of it are the same
        args = (args[1], args[0])
    return Op(name, tuple(args), dtype)


_COMMUTATIVE = frozenset({"add", "mul"})


def _rank(e: Expr) -> int:
    """Operand order of commutative ops: loads and indices, then computed values, constants."""
    return 2 if isinstance(e, Const) else 1 if isinstance(e, Op) else 0


def walk(e: Expr, seen: Optional[set] = None):
    """Every distinct sub-expression of e, children first."""
    seen = set() if seen is None else seen
    stack = [(e, False)]
    while stack:
        x, done = stack.pop()
        if x in seen:
            continue
        if done or not isinstance(x, Op):
            seen.add(x)
            yield x
            continue
        stack.append((x, True))
        stack.extend((a, False) for a in reversed(x.args))


def loads(e: Expr) -> list[Load]:
    """Every load of e, including loads inside indirect index values."""
    out = []
    for x in walk(e):
        if isinstance(x, Load):
            out.append(x)
            for s in x.index.free_symbols:
                if isinstance(s, Indirect):
                    out.extend(loads(s.value))
    return out


# ---- tensors ------------------------------------------------------------------------------

Fn = Callable[[Sequence[Index]], Expr]


@dataclass(frozen=True)
class StridedView:
    """A value that is a strided window of a real tensor: externs can take it without a copy."""
    buf: str
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class TensorValue:
    shape: tuple[int, ...]
    dtype: torch.dtype
    fn: Fn
    view: Optional[StridedView] = field(default=None, compare=False)

    def __call__(self, index: Sequence[Index]) -> Expr:
        return self.fn(index)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(out))


def linear(index: Sequence[Index], stride: Sequence[int], offset: int = 0) -> Index:
    return _linear(tuple(index), tuple(stride), offset)


@functools.lru_cache(maxsize=1 << 16)
def _linear(index: tuple, stride: tuple, offset: int) -> Index:
    """Memoised: equal kernels of repeated layers print over equal kernel-scope symbols, and a
    lowered value is evaluated at one index many times (sympy's own cache is 1000 entries)."""
    e = sympy.Add(sympy.Integer(offset), *[i * s for i, s in zip(index, stride) if s != 0])
    return merge_divmod(e)


def _factors(e: Index):
    for t in sympy.Add.make_args(e):
        yield from sympy.Mul.make_args(t)


def merge_divmod(e: Index) -> Index:
    """c*d*FloorDiv(x, d) + c*ModIndex(x, d) -> c*x: undoes the split a reshape introduced."""
    if not any(isinstance(t, ModIndex) for t in _factors(e)):
        return e
    terms = {}
    for t in sympy.Add.make_args(e):
        c, rest = t.as_coeff_Mul()
        terms[rest] = terms.get(rest, 0) + c
    changed = True
    while changed:
        changed = False
        for t in list(terms):
            if isinstance(t, ModIndex) and t in terms:
                x, d = t.args
                q = FloorDiv(x, d)
                if q in terms and terms[q] == terms[t] * d:
                    c = terms.pop(t)
                    terms.pop(q)
                    terms[x] = terms.get(x, 0) + c
                    changed = True
                    break
    return sympy.expand(sum((c * t for t, c in terms.items()), sympy.Integer(0)))


def reshape_index(idx: Sequence[Index], shape: Sequence[int], old: Sequence[int]) -> list:
    """The index into `old` of element `idx` of the same row-major data viewed as `shape`."""
    out = [sympy.Integer(0)] * len(old)
    for oi, nj in reshape_groups(old, shape):
        g = linear([idx[j] for j in nj], contiguous_strides([shape[j] for j in nj]))
        after = 1
        for k in reversed(oi):
            out[k] = ModIndex(FloorDiv(g, after), old[k])
            after *= old[k]
    return out


def reshape_groups(old, new) -> list[tuple[list[int], list[int]]]:
    """Minimal runs of old and new dims with equal products; size-1 dims stand alone."""
    i = j = 0
    out = []
    while i < len(old) or j < len(new):
        if j < len(new) and new[j] == 1 and (i >= len(old) or old[i] != 1):
            out.append(([], [j]))
            j += 1
            continue
        if i < len(old) and old[i] == 1 and (j >= len(new) or new[j] != 1):
            out.append(([i], []))
            i += 1
            continue
        oi, nj, po, pn = [i], [j], old[i], new[j]
        i, j = i + 1, j + 1
        while po != pn:
            if po < pn:
                oi.append(i)
                po *= old[i]
                i += 1
            else:
                nj.append(j)
                pn *= new[j]
                j += 1
        out.append((oi, nj))
    return out


def buffer_value(name: str, shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                 offset: int = 0) -> TensorValue:
    """A TensorValue reading a real tensor with the given strides."""
    shape, stride = tuple(int(s) for s in shape), tuple(int(s) for s in stride)
    return TensorValue(shape, dtype, lambda idx: Load(name, linear(idx, stride, offset), dtype),
                       StridedView(name, stride, offset))


def strided_view(base: TensorValue, shape: Sequence[int], stride: Sequence[int], offset: int,
                 fn: Fn) -> TensorValue:
    """A view of `base` whose strides are known when base is itself a strided buffer view."""
    view = None
    if base.view is not None:
        view = StridedView(base.view.buf, tuple(stride), base.view.offset + offset)
    return TensorValue(tuple(shape), base.dtype, fn, view)


def size_of(expr_count_limit: int, e: Expr) -> int:
    n = 0
    for _ in walk(e):
        n += 1
        if n > expr_count_limit:
            break
    return n


@dataclass(frozen=True)
class IndexSyntax:
    """How a backend spells index arithmetic: the only per-backend part of printing an index."""
    floordiv: str  # infix operator for non-negative floor division
    minimum: str  # function names for sympy.Min / sympy.Max
    maximum: str
    integer: Callable[[int], str]  # an integer literal
    backend: str


def print_index(e, syntax: IndexSyntax) -> str:
    """A sympy index expression (Add, Mul, FloorDiv, ModIndex, Min, Max) as backend source."""
    e = sympy.sympify(e)
    if e.is_Integer:
        return syntax.integer(int(e))
    if e.is_Symbol:
        return e.name
    if e.is_Add or e.is_Mul:
        op = " + " if e.is_Add else " * "
        return "(" + op.join(print_index(a, syntax) for a in e.args) + ")"
    if isinstance(e, (FloorDiv, ModIndex)):
        op = syntax.floordiv if isinstance(e, FloorDiv) else "%"
        return f"({print_index(e.args[0], syntax)} {op} {print_index(e.args[1], syntax)})"
    if isinstance(e, (sympy.Min, sympy.Max)):
        f = syntax.minimum if isinstance(e, sympy.Min) else syntax.maximum
        out = print_index(e.args[0], syntax)
        for a in e.args[1:]:
            out = f"{f}({out}, {print_index(a, syntax)})"
        return out
    raise NotImplementedError(f"trainc {syntax.backend}: index expression {e!r}")
