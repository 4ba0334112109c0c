"""The lowering registry: ATen op -> function(ctx, node, *args, **kwargs) -> TensorValue(s).

A lowering may return NotImplemented for argument combinations it does not handle; the node
then runs its ATen kernel in the wrapper (a fallback).
"""
from __future__ import annotations

from typing import Callable

import torch

LOWERINGS: dict = {}


def register(*ops) -> Callable:
    """Register a lowering for OpOverloads, or every overload of an OpOverloadPacket."""
    def deco(fn: Callable) -> Callable:
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    LOWERINGS[getattr(op, name)] = fn
            else:
                LOWERINGS[op] = fn
        return fn
    return deco


from trainc.codegen.lowerings import (  # noqa: E402,F401  (registration side effects)
    indexing, pointwise, reductions, views)
