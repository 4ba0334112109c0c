"""LoweredGraph / Schedule -> readable text (40_lowered.txt, 41_schedule.txt): every buffer,
every step's loop-IR expression, and how the scheduler grouped the steps into kernels.

Printing only reads: each compute node's expression is built over a fresh symbol scope
(`c` output dims, `r` reduced dims), so a dump never changes the graph's own symbol table.
"""
from __future__ import annotations

from collections import Counter

import torch

from trainc.codegen import ir
from trainc.codegen.symbols import Indirect, Symbols

_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
           torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32", torch.int16: "i16",
           torch.int8: "i8", torch.uint8: "u8", torch.bool: "b8"}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPES.get(dtype, str(dtype).replace("torch.", ""))


def tensor_type(dtype: torch.dtype, shape) -> str:
    return f"{dtype_name(dtype)}[{', '.join(map(str, shape))}]"


# -- the lowered graph -----------------------------------------------------------------------
def lowered_text(g) -> str:
    """A LoweredGraph: its buffers, then its steps in program order, outputs and hints."""
    computes = sum(1 for s in g.steps if hasattr(s, "fn"))
    lines = [f"# lowered graph: {len(g.buffers)} buffers, {len(g.steps)} steps "
             f"({computes} compute, {len(g.steps) - computes} calls)",
             "inputs: " + (", ".join(g.params) or "-"), "buffers:"]
    lines += [f"  {b.name}: {b.kind} {tensor_type(b.dtype, b.shape)} stride {b.stride}"
              for b in g.buffers.values()]
    lines.append("steps:")
    for step in g.steps:
        lines += node_lines(step) if hasattr(step, "fn") else [call_line(step)]
    lines.append("outputs: " + ", ".join(_arg(a) for a in g.outputs))
    if g.reuse:
        lines.append("reuse hints: " + ", ".join(f"{a} -> {b}" for a, b in g.reuse.items()))
    return "\n".join(lines) + "\n"


def node_lines(n) -> list[str]:
    """A compute node: its head line, then its expression (shared sub-expressions named t0...)."""
    syms = Symbols(tag="")
    out = syms.ranges("c", n.shape)
    head = f"  {n.name} = {n.kind} {tensor_type(n.dtype, n.shape)}"
    if n.kind == "reduction":
        head += f" {n.reduce_op} over r{list(n.rshape)}"
        body = [("", n.fn(out, syms.ranges("r", n.rshape)))]
    elif n.kind == "scatter":
        head += f" {n.reduce_op or 'store'} over r{list(n.rshape)}"
        r = syms.ranges("r", n.rshape)
        body = [("init", n.init(out)), ("at", n.index(r)), ("value", n.fn(r))]
    else:
        body = [("", n.fn(out))]
    if n.origins:
        head += f"  <- {', '.join(n.origins)}"
    if n.region:
        head += f"  [region {n.region}]"
    return [head] + _body_lines(body)


def _body_lines(body: list) -> list[str]:
    names: dict = {}
    lines: list[str] = []
    for _, e in body:
        if isinstance(e, ir.Expr):
            _name_shared(e, names, lines)
        else:
            _name_indirects(e, names, lines)
    for label, e in body:
        text = _spell(e, names) if isinstance(e, ir.Expr) else str(e)
        lines.append(f"    {label + ' ' if label else ''}= {text}")
    return lines


def _name_shared(e: ir.Expr, names: dict, lines: list[str]) -> None:
    """Names (t0, t1, ...) for ops read more than once, and the indirect index values e
    loads through, each defined in a line before its first use."""
    uses: Counter = Counter()
    order = list(ir.walk(e))
    for x in order:
        if isinstance(x, ir.Op):
            uses.update(x.args)
    for x in order:
        if isinstance(x, ir.Load):
            _name_indirects(x.index, names, lines)
        if isinstance(x, ir.Op) and uses[x] > 1 and x not in names:
            text = _spell(x, names)
            names[x] = f"t{sum(1 for k in names if isinstance(k, ir.Expr))}"
            lines.append(f"    {names[x]} = {text}")


def _name_indirects(index, names: dict, lines: list[str]) -> None:
    for s in sorted(getattr(index, "free_symbols", ()), key=str):
        if isinstance(s, Indirect) and s not in names:
            _name_shared(s.value, names, lines)
            lines.append(f"    {s.name} = {_spell(s.value, names)}  (< {s.size})")
            names[s] = s.name


def _spell(e, names: dict, top: bool = True) -> str:
    if not top and e in names:
        return names[e]
    if isinstance(e, ir.Load):
        return f"{e.buf}[{e.index}]"
    if isinstance(e, ir.Const):
        return f"{e.value!r}:{dtype_name(e.dtype)}"
    if isinstance(e, ir.IndexValue):
        return f"index({e.expr}):{dtype_name(e.dtype)}"
    if isinstance(e, ir.Op):
        args = ", ".join(_spell(a, names, False) for a in e.args)
        if e.name == "cast":
            return f"cast<{dtype_name(e.dtype)}>({args})"
        return f"{e.name}({args})"
    return str(e)


def call_line(c) -> str:
    outs = ", ".join(o or "_" for o in c.outputs) or "-"
    args = ", ".join([_arg(a) for a in c.args] +
                     [f"{k}={_arg(v)}" for k, v in c.kwargs.items()])
    line = f"  {outs} = {c.kind} {c.target}({args})"
    if c.origin:
        line += f"  <- {c.origin}"
    if c.inplace is not None:
        line += f"  [in place: {c.inplace[0]} writes {c.inplace[1]}]"
    if c.after:
        line += f"  [after {', '.join(c.after)}]"
    return line


def _arg(a) -> str:
    if hasattr(a, "buf") and hasattr(a, "whole"):  # a TensorArg
        return a.buf if a.whole else f"{a.buf}.view({list(a.shape)}, {list(a.stride)}, {a.offset})"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(_arg(x) for x in a)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    if isinstance(a, torch.dtype):
        return dtype_name(a)
    return repr(a)


# -- the schedule ----------------------------------------------------------------------------
def schedule_text(s) -> str:
    """A Schedule: its kernels (outer dims, loops, local and scratch buffers, bytes) and calls,
    in program order."""
    kernels = [i for i in s.items if hasattr(i, "loops")]
    lines = [f"# schedule: {len(kernels)} kernels, {len(s.items) - len(kernels)} calls"]
    for item in s.items:
        lines += kernel_lines(item) if hasattr(item, "loops") else [call_line(item).strip()]
    if s.graph.storage:  # in-place results (codegen/memory/inplace.py), once it has run
        lines.append("in place: " + ", ".join(f"{a} in {b}" for a, b in s.graph.storage.items()))
    return "\n".join(lines) + "\n"


def kernel_lines(k) -> list[str]:
    outer = "x".join(map(str, k.outer)) if k.outer else "1"
    head = f"{k.name}: {k.kind}, outer {outer}"
    if k.info is not None:
        head += f", reads {k.info.bytes_read} B, writes {k.info.bytes_written} B"
    lines = [head]
    for lp in k.loops:
        inner = "x".join(map(str, lp.inner)) or "1"
        steps = ", ".join(f"{n.name}={n.reduce_op}" if n.kind == "reduction" else n.name
                          for n in lp.steps)
        lines.append(f"  loop {inner}: {steps}")
    stored = [n.name for n in k.nodes if n.name not in k.local]
    lines.append(f"  stores: {', '.join(stored) or '-'}")
    local = sorted(k.local - k.scratch)
    if local:
        lines.append(f"  local: {', '.join(local)}")
    if k.scratch:
        lines.append(f"  scratch: {', '.join(sorted(k.scratch))}")
    for buf, b in k.layouts.items():
        lines.append(f"  {buf} indexed as {tensor_type(b.dtype, b.shape)} stride {b.stride}")
    return lines
