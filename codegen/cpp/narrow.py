"""Which int64 values a C++ kernel may compute in int32: index values (max-pool window
positions, aranges) whose bounds fit, small constants, and selects between them. In a vector
loop over float data, int64 lanes take two registers per float register and GCC 12 often gives
up on loops that mix them with 1-byte masks; the narrowed values compare and select as int32.
Values are unchanged: every narrowed value is provably within int32, and anything else that
reads one (arithmetic, calls) gets it widened back to int64 first."""
from __future__ import annotations

import torch

from trainc.codegen import ir

INT32 = (-2**31, 2**31 - 1)
KEEPS_NARROW = frozenset("where eq ne lt le gt ge".split())  # exact on int32 operands


def fits(lo, hi) -> bool:
    return INT32[0] <= lo and hi <= INT32[1]


def is_narrow(e: ir.Expr, memo: dict) -> bool:
    """e is an int64 value that can be computed in int32 without changing it."""
    if e in memo:
        return memo[e]
    out = False
    if e.dtype == torch.int64:
        if isinstance(e, ir.IndexValue):
            out = fits(*ir.bounds(e.expr))
        elif isinstance(e, ir.Const):
            out = fits(e.value, e.value)
        elif isinstance(e, ir.Op) and e.name == "where":
            out = is_narrow(e.args[1], memo) and is_narrow(e.args[2], memo)
    memo[e] = out
    return out
