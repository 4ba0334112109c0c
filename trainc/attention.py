"""Explicit attention -> scaled_dot_product_attention, rewritten while the forward is traced.

    softmax((q @ k.transpose(-2, -1)) * s  [.masked_fill(~ones(T, T).tril(), -inf)], dim=-1)
        [dropout with p == 0 or not training]  @ v

is recognized as the user's code runs under `tracing()`, a TorchFunctionMode that follows each
tensor's provenance, and the final matmul returns
`F.scaled_dot_product_attention(q, k, v, is_causal=<mask seen>, scale=s)`. The rewrite has to
happen before autograd sees the ops: the backward then is the attention op's own (an extern
kernel: flash attention on CUDA and CPU), and the T x T scores are never stored. The explicit
ops already traced feed nothing afterwards and are removed as dead code.

Anything else (another mask, dropout that drops, a softmax over another dim, mixed dtypes)
is left as written, and so are short CPU sequences (`CPU_MIN_SEQ`, where the fused explicit
form is faster). `Config.fuse_attention=False` turns the rewrite off; the count of rewrites is
reported by `explain()` (`attention_rewrites`).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# On CPU, below this many query positions the fused explicit form is faster than the attention
# op (measured: BENCHMARKS.md, session 23 driver section). CUDA: always rewritten.
CPU_MIN_SEQ = 128


class _Attention(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.tags: dict[int, tuple[torch.Tensor, tuple]] = {}  # id -> (tensor kept alive, tag)
        self.rewrites = 0

    def tag(self, t: Any) -> Optional[tuple]:
        if not isinstance(t, torch.Tensor):
            return None
        hit = self.tags.get(id(t))
        return hit[1] if hit is not None and hit[0] is t else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("matmul", "__matmul__") and len(args) == 2 and not kwargs:
            out = self._attention(*args)
            if out is not None:
                self.rewrites += 1
                return out
        out = func(*args, **kwargs)
        tag = None
        if name in _RULES:
            try:
                tag = _RULES[name](self, out, *args, **kwargs)
            except (TypeError, ValueError):  # another signature than the pattern's: no match
                tag = None
        if tag is not None and isinstance(out, torch.Tensor):
            self.tags[id(out)] = (out, tag)
        return out

    def _attention(self, a, b) -> Optional[torch.Tensor]:
        tag = self.tag(a)
        if tag is None or tag[0] != "att" or not isinstance(b, torch.Tensor):
            return None
        _, q, k, scale, causal = tag
        v = b
        if q.device.type == "cpu" and q.shape[-2] < CPU_MIN_SEQ:
            return None
        if v.dim() != q.dim() or v.shape[-2] != k.shape[-2] or v.dtype != q.dtype or \
                v.device != q.device or v.shape[:-2] != q.shape[:-2]:
            return None
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _transpose(mode, out, x, *dims, **kw) -> Optional[tuple]:
    dims = tuple(kw.get(k, d) for k, d in zip(("dim0", "dim1"), dims)) if dims else \
        (kw.get("dim0"), kw.get("dim1"))
    if not isinstance(x, torch.Tensor) or x.dim() < 3 or len(dims) != 2 or None in dims:
        return None
    last = {d % x.dim() for d in dims}
    return ("kT", x) if last == {x.dim() - 1, x.dim() - 2} else None


def _matmul(mode, out, a, b) -> Optional[tuple]:
    tag = mode.tag(b)
    if tag is None or tag[0] != "kT" or not isinstance(a, torch.Tensor):
        return None
    k = tag[1]
    if a.dim() != k.dim() or a.shape[:-2] != k.shape[:-2] or a.shape[-1] != k.shape[-1] or \
            a.dtype != k.dtype or a.dtype not in _FLOATS or a.device != k.device:
        return None
    return ("scores", a, k, 1.0)


def _scaled(mode, out, a, b, divide=False) -> Optional[tuple]:
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        a, b = b, a
    tag = mode.tag(a)
    if tag is None or tag[0] != "scores" or isinstance(b, bool) or \
            not isinstance(b, (int, float)) or not math.isfinite(b) or b == 0:
        return None
    return ("scores", tag[1], tag[2], tag[3] / b if divide else tag[3] * b)


def _ones(mode, out, *args, **kw) -> Optional[tuple]:
    return ("ones",) if isinstance(out, torch.Tensor) and out.dim() == 2 else None


def _tril(mode, out, x, diagonal=0) -> Optional[tuple]:
    tag = mode.tag(x)
    if tag != ("ones",) or diagonal != 0 or x.shape[0] != x.shape[1]:
        return None
    return ("causal",)


def _invert(mode, out, x) -> Optional[tuple]:
    return ("above",) if mode.tag(x) == ("causal",) and x.dtype == torch.bool else None


def _masked_fill(mode, out, x, mask, value) -> Optional[tuple]:
    tag = mode.tag(x)
    if tag is None or tag[0] != "scores" or mode.tag(mask) != ("above",):
        return None
    if not (isinstance(value, float) and value == -math.inf):
        return None
    _, q, k, scale = tag
    if tuple(mask.shape) != (q.shape[-2], k.shape[-2]) or q.shape[-2] != k.shape[-2]:
        return None
    return ("masked", q, k, scale)


def _softmax(mode, out, x, dim=None, dtype=None, **kw) -> Optional[tuple]:
    dim = kw.get("dim", dim)
    tag = mode.tag(x)
    if tag is None or tag[0] not in ("scores", "masked") or dtype is not None or \
            kw.get("dtype") is not None or dim is None or dim % x.dim() != x.dim() - 1:
        return None
    return ("att", tag[1], tag[2], tag[3], tag[0] == "masked")


def _dropout(mode, out, x, p=0.5, training=True, inplace=False) -> Optional[tuple]:
    tag = mode.tag(x)
    if tag is None or tag[0] != "att" or inplace or (training and p != 0):
        return None
    return tag


_RULES = {
    "transpose": _transpose, "matmul": _matmul, "__matmul__": _matmul,
    "mul": _scaled, "__mul__": _scaled, "__rmul__": _scaled,
    "div": lambda m, o, a, b: _scaled(m, o, a, b, True),
    "__truediv__": lambda m, o, a, b: _scaled(m, o, a, b, True),
    "ones": _ones, "tril": _tril, "__invert__": _invert, "logical_not": _invert,
    "bitwise_not": _invert, "masked_fill": _masked_fill, "softmax": _softmax,
    "dropout": _dropout,
}


@contextlib.contextmanager
def tracing(enabled: bool = True) -> Iterator[Optional[_Attention]]:
    """Rewrite explicit attention inside this block (None: disabled). The yielded mode's
    `rewrites` counts the attention ops it made."""
    if not enabled:
        yield None
        return
    mode = _Attention()
    with mode:
        yield mode
