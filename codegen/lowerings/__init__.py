"""The lowering registry: ATen op -> function(ctx, node, *args, **kwargs) -> TensorValue(s).

A lowering may return NotImplemented for argument combinations it does not handle; the node
then runs its ATen kernel in the wrapper (a fallback).
"""
from __future__ import annotations

from typing import Callable

import torch

LOWERINGS: dict = {}


# dtypes the generated code computes in; anything else (complex, float8, ...) falls back.
SUPPORTED_DTYPES = frozenset({
    torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool})


def register(*ops) -> Callable:
    """Register a lowering for OpOverloads, or every overload of an OpOverloadPacket.

    The registered function first checks the node's dtypes and answers NotImplemented (an
    ATen fallback) for any it does not generate code for.
    """
    def deco(fn: Callable) -> Callable:
        def guarded(ctx, node, *args, **kwargs):
            if not _dtypes_fit(node):
                return NotImplemented
            return fn(ctx, node, *args, **kwargs)
        guarded.__name__ = guarded.__qualname__ = fn.__name__
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    LOWERINGS[getattr(op, name)] = guarded
            else:
                LOWERINGS[op] = guarded
        return fn
    return deco


def _dtypes_fit(node) -> bool:
    vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    return all(t.dtype in SUPPORTED_DTYPES for v in vals
               for t in (v if isinstance(v, (list, tuple)) else [v])
               if isinstance(t, torch.Tensor))


from trainc.codegen.lowerings import (  # noqa: E402,F401  (registration side effects)
    indexing, pointwise, pooling, reductions, views)
