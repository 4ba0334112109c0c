"""Kernel names that say what a kernel computes (`kernel5_mul_sigmoid_sub_add`), so a GPU
profile or a perf report reads without the dumps: the scheduler's name, then the kernel's first
few distinct operations in the order they appear (casts left out) and its reductions."""
from __future__ import annotations

import dataclasses
import re

from trainc.codegen import ir
from trainc.codegen.graph import ComputeNode, LoweredGraph
from trainc.codegen.scheduler import Kernel, Schedule
from trainc.codegen.symbols import Symbols

MOST = 4  # operations a name lists, at most
SKIP = frozenset({"cast"})


def name_kernels(sched: Schedule) -> Schedule:
    for item in sched.items:
        if isinstance(item, Kernel):
            label = kernel_label(item, sched.graph)
            item.name = f"{item.name}_{label}" if label else item.name
            if item.info is not None:
                item.info = dataclasses.replace(item.info, name=item.name)
    return sched


def kernel_label(kern: Kernel, g: LoweredGraph) -> str:
    ops: list[str] = []
    scope = Symbols(tag="n")  # not the graph's table: naming adds no analysis symbols
    for n in kern.nodes:
        for e in _exprs(n, scope):
            ops += [x.name for x in ir.walk(e) if isinstance(x, ir.Op) and x.name not in SKIP]
        if n.kind == "reduction":
            ops.append(n.reduce_op)
        elif n.kind == "scatter":
            ops.append("scatter")
    names = [re.sub(r"\W", "", op) for op in dict.fromkeys(ops)]
    return "_".join(filter(None, names[:MOST]))


def _exprs(n: ComputeNode, scope: Symbols) -> list:
    i = scope.ranges("i", n.shape)
    if n.kind == "reduction":
        return [n.fn(i, scope.ranges("r", n.rshape))]
    if n.kind == "scatter":
        v = scope.ranges("v", n.rshape)
        return [n.fn(v)] + ([n.init(i)] if n.init is not None else [])
    return [n.fn(i)]
