"""C++ spelling of a kernel's reductions: accumulators (scalars, or one per lane), their update
per element, the fold of accumulator sets and of thread partials, and the final value.

The printer functions take the kernel printer `p` (codegen/cpp/printer.py): it names
temporaries, stores values and keeps each accumulator variable's C type (acc_types)."""
from __future__ import annotations

import torch

from trainc.codegen import ir
from trainc.codegen.cpp.exprs import cast_code, ctype, index_code
from trainc.codegen.cpp.threads import gather_partials
from trainc.codegen.graph import ComputeNode
from trainc.codegen.symbols import Symbols

# how each accumulator variable of a reduction folds b into a (max/min: value, then NaN flag)
COMBINE = {
    "sum": [lambda a, b: f"{a} += {b};"],
    "prod": [lambda a, b: f"{a} *= {b};"],
    "max": [lambda a, b: f"{a} = ({b} > {a}) ? {b} : {a};", lambda a, b: f"{a} |= {b};"],
    "min": [lambda a, b: f"{a} = ({b} < {a}) ? {b} : {a};", lambda a, b: f"{a} |= {b};"],
}
FOLDABLE = frozenset(COMBINE)  # reductions whose partial results fold (thread splits, unrolls)


def acc_init(p, body, n: ComputeNode) -> list[str]:
    """Declares n's accumulator variables; returns how the loop names them."""
    e_dtype = expr_dtype(n, p.syms)
    op = n.reduce_op
    t = acc_ctype(op, e_dtype)
    acc = p.tmp()
    if op in ("sum", "prod"):
        vars_ = [(t, acc, f"{t}({0 if op == 'sum' else 1})")]
    elif op in ("max", "min"):
        # an int flag, not bool: GCC has no vector type for bool and would keep it scalar
        vars_ = [(t, acc, extreme(e_dtype, op == "max")), ("int", acc + "n", "0")]
    else:
        vars_ = [(t, acc, extreme(e_dtype, op == "argmax")), ("int64_t", acc + "i", "0")]
    p.acc_types.update((v, ty) for ty, v, _ in vars_)
    if not p.lanes:
        body.emit(" ".join(f"{ty} {v} = {init};" for ty, v, init in vars_))
        return [v for _, v, _ in vars_]
    w = p.lanes
    body.emit(" ".join(f"{ty} {v}[{w}];" for ty, v, _ in vars_) +
              f" for (int64_t j = 0; j < {w}; ++j) {{ " +
              " ".join(f"{v}[j] = {init};" for _, v, init in vars_) + " }")
    return [f"{v}[j]" for _, v, _ in vars_]


def acc_ctype(op: str, dtype: torch.dtype) -> str:
    """The C type of a reduction's accumulator. Sums computed in float accumulate in double: a
    float accumulator taking one simd block after another drifts by up to n ulps, where eager's
    cascade sum stays within a few (a BatchNorm backward that cancels amplified it to 10x
    eager's gradient error: finding zoo_cpp_None_34102_69)."""
    t = ctype(dtype)
    return "double" if op == "sum" and t == "float" else t


def accumulate(body, n: ComputeNode, acc, e: ir.Expr, isyms, inner) -> None:
    """One element's update of n's accumulators by value e."""
    v = body.value(e)
    op = n.reduce_op
    if op == "sum":
        body.emit(f"{acc[0]} += {v};")
    elif op == "prod":
        body.emit(f"{acc[0]} *= {v};")
    elif op in ("max", "min"):
        cmp = ">" if op == "max" else "<"
        body.emit(f"{acc[0]} = ({v} {cmp} {acc[0]}) ? {v} : {acc[0]}; "
                  f"{acc[1]} |= ({v} != {v});")
    else:
        cmp = ">" if op == "argmax" else "<"
        flat = index_code(ir.linear(isyms, ir.contiguous_strides(inner)))
        body.emit(f"if (({v} {cmp} {acc[0]}) || ({v} != {v} && {acc[0]} == {acc[0]})) "
                  f"{{ {acc[0]} = {v}; {acc[1]} = {flat}; }}")


def finish(p, body, n: ComputeNode, acc, osyms) -> None:
    """n's final value from its accumulators, stored unless local."""
    final = p.tmp()
    t = ctype(expr_dtype(n, p.syms))
    if n.reduce_op in ("max", "min"):
        nan = f"std::numeric_limits<{t}>::quiet_NaN()" if t in ("float", "double") else acc[0]
        value = f"{acc[1]} ? {nan} : {acc[0]}"
    elif n.reduce_op in ("argmax", "argmin"):
        t, value = "int64_t", acc[1]
    else:
        value = acc[0]
    dt = p.g.buffers[n.name].dtype
    if dt in (torch.bfloat16, torch.float16):  # later steps read it as stored: rounded
        value = cast_code(value, dt, dt)
    if p.lanes:
        body.emit(f"{t} {final}[{p.lanes}];")
        p.open_lanes(body, "", True)
        body.emit(f"  {final}[j] = {value};")
        final += "[j]"
    else:
        body.emit(f"const {t} {final} = {value};")
    p.values[n.name] = final
    if n.name not in p.k.local:
        b = p.k.layout(n.name, p.g)
        p.store(body, n, index_code(ir.linear(osyms, b.stride)), final)
    if p.lanes:
        body.emit("}")


def combine(body, lanes: int, reds, sets) -> None:
    """Fold accumulator sets 1.. into set 0, in set order (deterministic)."""
    body.emit(f"for (int64_t j = 0; j < {lanes}; ++j) {{")
    for acc_set in sets[1:]:
        for n in reds:
            for a, b, c in zip(sets[0][n.name], acc_set[n.name], COMBINE[n.reduce_op]):
                body.emit("  " + c(a, b))
    body.emit("}")


def gather(p, body, reds, accs) -> None:
    """Every thread's partial accumulators, folded in thread order into each thread's; the
    shared partial arrays go to p.parts, declared before the parallel region."""
    vars_ = [(p.acc_types[a[:-3]], a[:-3], c) for n in reds
             for a, c in zip(accs[n.name], COMBINE[n.reduce_op])]
    decls, lines = gather_partials(vars_, p.lanes, p.plan.threads)
    p.parts += decls
    for line in lines:
        body.emit(line)


def simd_pragma(reds, accs) -> str:
    clauses = []
    for n in reds:
        a = accs[n.name]
        if n.reduce_op == "sum":
            clauses.append(f"reduction(+:{a[0]})")
        elif n.reduce_op == "prod":
            clauses.append(f"reduction(*:{a[0]})")
        else:
            clauses.append(f"reduction({'max' if n.reduce_op == 'max' else 'min'}:{a[0]}) "
                           f"reduction(|:{a[1]})")
    return "#pragma omp simd " + " ".join(clauses)


def expr_dtype(n: ComputeNode, syms: Symbols) -> torch.dtype:
    return n.fn(syms.ranges("c", n.shape), syms.ranges("c", n.rshape)).dtype


def extreme(dtype: torch.dtype, lowest: bool) -> str:
    t = ctype(dtype)
    if dtype == torch.bool:
        return "false" if lowest else "true"
    if dtype.is_floating_point:
        return f"{'-' if lowest else ''}std::numeric_limits<{t}>::infinity()"
    return f"std::numeric_limits<{t}>::{'lowest' if lowest else 'max'}()"
