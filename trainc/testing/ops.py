"""The op catalog of random programs: each entry draws operands and returns one line of source.

An entry is `op(draw, b) -> Optional[Line]`; `b` is the program builder (programs.py) that knows
the current values and their example tensors. None means "not applicable here"; the builder
also drops lines that eager PyTorch rejects, so entries may be optimistic about shapes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import hypothesis.strategies as st
import torch


@dataclass(frozen=True)
class Line:
    text: str  # an expression (kind "value"/"dropout") or a statement (kind "inplace")
    uses: tuple[str, ...]
    kind: str = "value"


UNARY = ("torch.tanh({a})", "torch.sigmoid({a})", "torch.relu({a})", "F.gelu({a})",
         "F.silu({a})", "torch.exp({a})", "torch.sin({a})", "{a}.abs()", "-{a}", "{a} * {a}",
         "torch.log1p({a}.abs())", "torch.sqrt({a}.abs() + 1)", "torch.rsqrt({a} * {a} + 1)",
         "F.softplus({a})", "torch.erf({a})", "{a}.clamp(-0.5, 0.5)", "{a} * 2.5", "{a} + 1.5",
         "torch.where({a} > 0, {a}, 0.1 * {a})", "{a}.pow(3)", "1 / ({a}.abs() + 1)",
         "F.leaky_relu({a}, 0.2)", "torch.log(torch.exp({a}) + 1)")
BINARY = ("{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / ({b}.abs() + 1)",
          "torch.maximum({a}, {b})", "torch.where({b} > 0, {a}, {b})", "torch.lerp({a}, {b}, 0.3)")
DROPOUT_P = (0.5, 0.1, 0.3, 0.9)


def _dim(draw, t: torch.Tensor) -> int:
    n = max(t.dim(), 1)
    return draw(st.integers(-n, n - 1))


def _dims_arg(draw, t: torch.Tensor) -> str:
    """One dim, or a tuple of distinct dims."""
    if t.dim() >= 2 and draw(st.booleans()):
        dims = draw(st.lists(st.integers(0, t.dim() - 1), min_size=2, max_size=t.dim(),
                             unique=True))
        return "(" + ", ".join(map(str, sorted(dims))) + ")"
    return str(_dim(draw, t))


def index_src(draw, shape: tuple[int, ...], high: int, unique: bool = False) -> Optional[str]:
    """Source of a constant int64 index tensor of `shape` with values in [0, high)."""
    n = 1
    for s in shape:
        n *= s
    if n > 32 or (n > 0 and high <= 0) or (unique and n > high):
        return None
    if unique:
        values = draw(st.permutations(range(high)))[:n]
    else:
        values = draw(st.lists(st.integers(0, high - 1), min_size=n, max_size=n)) if n else []
    text = f"torch.tensor({list(values)}, dtype=torch.long)"
    if len(shape) != 1:
        text += f".reshape{_tuple(shape)}"
    return text


def _tuple(xs) -> str:
    xs = tuple(xs)
    return f"({xs[0]},)" if len(xs) == 1 else str(xs)


def unary(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    return Line(draw(st.sampled_from(UNARY)).format(a=a), (a,))


def binary(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    other = b.pick(draw, lambda t: _broadcasts(t.shape, b.val(a).shape))
    if other is None:
        return None
    return Line(draw(st.sampled_from(BINARY)).format(a=a, b=other), (a, other))


def reduction(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    t, k = b.val(a), draw(st.booleans())
    kind = draw(st.sampled_from(("sum", "mean", "amax", "var", "logsumexp", "softmax",
                                 "log_softmax", "cumsum", "sum_all")))
    if kind == "sum_all":
        return Line(f"{a}.sum()", (a,))
    if kind in ("sum", "mean", "var"):
        return Line(f"{a}.{kind}({_dims_arg(draw, t)}, keepdim={k})", (a,))
    d = _dim(draw, t)
    if kind in ("amax",):
        return Line(f"{a}.amax({d}, keepdim={k})", (a,))
    if kind == "logsumexp":
        return Line(f"torch.logsumexp({a}, {d}, keepdim={k})", (a,))
    return Line(f"torch.{kind}({a}, {d})", (a,))


def view(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    t = b.val(a)
    kind = draw(st.sampled_from(("transpose", "permute", "slice", "select", "expand", "reshape",
                                 "flip", "cat", "unsqueeze", "squeeze", "flatten")))
    if kind in ("transpose", "permute") and t.dim() < 2:
        return None
    if kind == "transpose":
        d1, d2 = draw(st.lists(st.integers(0, t.dim() - 1), min_size=2, max_size=2, unique=True))
        return Line(f"{a}.transpose({d1}, {d2})", (a,))
    if kind == "permute":
        return Line(f"{a}.permute{_tuple(draw(st.permutations(range(t.dim()))))}", (a,))
    if kind == "flip" and t.dim() >= 1:
        return Line(f"{a}.flip({_dim(draw, t)})", (a,))
    if kind in ("unsqueeze", "squeeze"):
        d = draw(st.integers(-t.dim() - 1, t.dim())) if kind == "unsqueeze" else _dim(draw, t)
        return Line(f"{a}.{kind}({d})", (a,))
    if kind == "flatten":
        return Line(f"{a}.flatten()", (a,))
    if t.dim() == 0:
        return None
    return {"slice": _slice, "select": _select, "expand": _expand, "reshape": _reshape,
            "cat": _cat, "flip": _slice}[kind](draw, b, a, t)


def _slice(draw, b, a: str, t: torch.Tensor) -> Line:
    d = draw(st.integers(0, t.dim() - 1))
    size = t.shape[d]
    start, step = draw(st.integers(0, size)), draw(st.integers(1, 3))
    stop = draw(st.one_of(st.none(), st.integers(start, size)))
    part = f"{start or ''}:{'' if stop is None else stop}" + (f":{step}" if step > 1 else "")
    return Line(f"{a}[{':, ' * d}{part}]", (a,))


def _select(draw, b, a: str, t: torch.Tensor) -> Optional[Line]:
    d = draw(st.integers(0, t.dim() - 1))
    if t.shape[d] == 0:
        return None
    return Line(f"{a}.select({d}, {draw(st.integers(-t.shape[d], t.shape[d] - 1))})", (a,))


def _expand(draw, b, a: str, t: torch.Tensor) -> Line:
    sizes = [draw(st.integers(1, 4)) if s == 1 else -1 for s in t.shape]
    if draw(st.booleans()):
        sizes = [draw(st.integers(1, 3))] + sizes
    return Line(f"{a}.expand{_tuple(sizes)}", (a,))


def _reshape(draw, b, a: str, t: torch.Tensor) -> Optional[Line]:
    shape = list(t.shape)
    kind = draw(st.sampled_from(("merge", "split", "flat2")))
    if kind == "merge" and len(shape) >= 2:
        i = draw(st.integers(0, len(shape) - 2))
        shape[i:i + 2] = [shape[i] * shape[i + 1]]
    elif kind == "split":
        i = draw(st.integers(0, len(shape) - 1))
        divisors = [f for f in range(1, shape[i] + 1) if shape[i] % f == 0] or [1]
        f = draw(st.sampled_from(divisors))
        shape[i:i + 1] = [f, shape[i] // f if f else 0]
    else:
        shape = [-1, 1] if t.numel() == 0 else [t.numel() // shape[-1] if shape[-1] else 0,
                                                  shape[-1]]
    return Line(f"{a}.reshape{_tuple(shape)}", (a,))


def _cat(draw, b, a: str, t: torch.Tensor) -> Line:
    d = draw(st.integers(0, t.dim() - 1))
    other = b.pick(draw, lambda u: u.dim() == t.dim() and all(
        u.shape[i] == t.shape[i] for i in range(t.dim()) if i != d)) or a
    return Line(f"torch.cat([{a}, {other}], dim={d})", (a, other))


def matmul(draw, b) -> Optional[Line]:
    a = b.pick(draw, lambda t: t.dim() >= 1)
    if a is None:
        return None
    t = b.val(a)
    if draw(st.booleans()):
        w = b.pick(draw, lambda u: u.dim() == 2 and u.shape[1] == t.shape[-1])
        if w is not None:
            bias = b.pick(draw, lambda u: u.dim() == 1 and u.shape[0] == b.val(w).shape[0])
            if bias is not None and draw(st.booleans()):
                return Line(f"F.linear({a}, {w}, {bias})", (a, w, bias))
            return Line(f"F.linear({a}, {w})", (a, w))
    other = b.pick(draw, lambda u: _matmul_ok(t, u))
    if other is not None:
        return Line(f"{a} @ {other}", (a, other))
    return Line(f"{a} @ {a}.transpose(-2, -1)" if t.dim() >= 2 else f"{a} @ {a}", (a,))


def index(draw, b) -> Optional[Line]:
    a = b.pick(draw, lambda t: t.dim() >= 1)
    if a is None:
        return None
    t = b.val(a)
    kind = draw(st.sampled_from(("embedding", "gather", "index_select", "index_put",
                                 "getitem")))
    if kind == "embedding":
        if t.dim() != 2:
            return None
        idx = index_src(draw, _small_shape(draw, 2), t.shape[0])
        return Line(f"F.embedding({idx}, {a})", (a,)) if idx else None
    d = draw(st.integers(0, t.dim() - 1))
    if kind == "gather":
        shape = tuple(draw(st.integers(0, s)) if i != d else draw(st.integers(0, 3))
                      for i, s in enumerate(t.shape))
        idx = index_src(draw, shape, t.shape[d])
        return Line(f"torch.gather({a}, {d}, {idx})", (a,)) if idx else None
    idx = index_src(draw, (draw(st.integers(0, 4)),), t.shape[d if kind == "index_select" else 0],
                    unique=kind == "index_put")
    if idx is None:
        return None
    if kind == "index_select":
        return Line(f"{a}.index_select({d}, {idx})", (a,))
    if kind == "getitem":
        return Line(f"{a}[{idx}]", (a,))
    vals = b.pick(draw, lambda u: _broadcasts_to(u.shape, t.shape[1:]))
    acc = draw(st.booleans())
    if vals is None:
        return Line(f"{a}.index_put(({idx},), {a}.new_full((), 2.0), accumulate={acc})", (a,))
    return Line(f"{a}.index_put(({idx},), {vals}, accumulate={acc})", (a, vals))


def inplace(draw, b) -> Optional[Line]:
    """Mutate an intermediate (never an input or a view of one) in place."""
    tgt = b.pick(draw, mutable=True)
    if tgt is None:
        return None
    t = b.val(tgt)
    if any(n > 1 and st == 0 for n, st in zip(t.shape, t.stride())):
        return None  # an expanded view: several elements share memory, eager refuses writes
    kind = draw(st.sampled_from(("add_", "mul_", "relu_", "clamp_", "setitem", "index_put_")))
    if kind == "add_":
        other = b.pick(draw, lambda u: _broadcasts_to(u.shape, t.shape))
        return Line(f"{tgt}.add_({other})", (tgt, other), "inplace") if other else None
    if kind in ("mul_", "relu_", "clamp_"):
        arg = {"mul_": "0.5", "relu_": "", "clamp_": "min=-1.0"}[kind]
        return Line(f"{tgt}.{kind}({arg})", (tgt,), "inplace")
    if t.dim() == 0:
        return None
    if kind == "index_put_":
        idx = index_src(draw, (draw(st.integers(0, 4)),), t.shape[0])
        return Line(f"{tgt}.index_put_(({idx},), {tgt}.new_full((), 0.5), accumulate=True)",
                    (tgt,), "inplace") if idx else None
    sl = _slice(draw, b, tgt, t).text
    target_shape = eval(sl, {}, {tgt: torch.empty(t.shape, device="meta")}).shape
    other = b.pick(draw, lambda u: _broadcasts_to(u.shape, target_shape))
    return Line(f"{sl} = {other or 0.25}", (tgt,) + ((other,) if other else ()), "inplace")


def dropout(draw, b) -> Optional[Line]:
    a = b.pick(draw)
    return Line(f"F.dropout({a}, p={draw(st.sampled_from(DROPOUT_P))})", (a,), "dropout")


def _small_shape(draw, max_rank: int) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.integers(0, 3), min_size=1, max_size=max_rank)))


def _broadcasts(s1, s2) -> bool:
    try:
        torch.broadcast_shapes(s1, s2)
        return True
    except RuntimeError:
        return False


def _broadcasts_to(src, dst) -> bool:
    return _broadcasts(src, dst) and tuple(torch.broadcast_shapes(src, dst)) == tuple(dst)


def _matmul_ok(t: torch.Tensor, u: torch.Tensor) -> bool:
    if u.dim() == 0:
        return False
    k = u.shape[0] if u.dim() == 1 else u.shape[-2]
    if t.shape[-1] != k:
        return False
    return t.dim() <= 2 or u.dim() <= 2 or _broadcasts(t.shape[:-2], u.shape[:-2])


# op family -> relative weight (pointwise and views dominate real programs)
OPS: dict[Callable, int] = {unary: 6, binary: 6, reduction: 4, view: 6, matmul: 2, index: 2,
                            inplace: 2, dropout: 1}
