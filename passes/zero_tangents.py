"""Fold the backward of outputs nobody differentiated: their tangents are known zeros.

Eager autograd never runs the backward ops of an output whose gradient is None (a causal
LM's logits beside its loss, its KV caches): their contributions are absent, not computed
from zeros. The traced backward computes them from the zero tangent the runtime passes. With
such tangents marked zero, this pass propagates "known zero" forward, one rule per ATen op:

- an op linear in a zero operand (mm, bmm, mul, div's numerator, views, sums, casts, the
  backward formulas of activations and softmax) is zero;
- an add or sub of a zero is its other operand (when that has the result's shape and dtype);
- any other op gets a dense zeros tensor for its zero operands, as do the graph's outputs.

The backward is linear in its tangents, so the dropped ops are exactly those eager skips:
the result matches eager even where the other operand holds inf or nan (computing 0 * inf
would give nan; eager computes nothing). Zeros this pass did not make (constants in the
graph) are folded only by rules whose result is zero for every value of the other operands.
The zero placeholders stay (the signature is unchanged) but nothing reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import operator
from typing import Callable, Optional, Sequence, Union

import torch
import torch.fx as fx

from trainc.graph import val
from trainc.passes._graph import fake_mode, infer_val, is_mutating, recompiled

aten, prims = torch.ops.aten, torch.ops.prims


class _Zero:
    def __repr__(self) -> str:
        return "ZERO"


ZERO = _Zero()  # a rule's answer: the node's value is zero
# A rule answers ZERO, a node (or value) that replaces the node, or None (keep the node).
Rule = Callable[[fx.Node, Callable[[object], bool]], Union[_Zero, fx.Node, None]]
ZERO_RULES: dict[object, Rule] = {}


@dataclass
class ZeroFolds:
    """What one run did, stored in gm.meta[ZERO_FOLDS]."""
    zero_inputs: tuple[str, ...]
    dropped: dict[str, int] = field(default_factory=dict)  # op name -> nodes that became zero
    forwarded: int = 0  # adds/subs replaced by their other operand
    materialized: list[str] = field(default_factory=list)  # names given a dense zeros

    def __str__(self) -> str:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.dropped.items()))
        return (f"zero tangents {list(self.zero_inputs)}: dropped {ops or 'nothing'}; "
                f"{self.forwarded} adds forwarded; {len(self.materialized)} zeros materialized")


ZERO_FOLDS = "trainc.zero_folds"


def register(*ops) -> Callable[[Rule], Rule]:
    def deco(rule: Rule) -> Rule:
        for op in ops:
            ZERO_RULES[op] = rule
        return rule
    return deco


def fold_zero_tangents(gm: fx.GraphModule, zero_inputs: Sequence[str]) -> fx.GraphModule:
    """`gm` (functional) with the placeholders named `zero_inputs` taken as zeros and every
    op that only propagates them removed."""
    names = set(zero_inputs)
    known = {p for p in gm.graph.nodes if p.op == "placeholder" and p.name in names}
    missing = names - {p.name for p in known}
    if missing:
        raise ValueError(f"fold_zero_tangents: no placeholders named {sorted(missing)}")
    report = ZeroFolds(tuple(zero_inputs))
    is_zero = lambda a: isinstance(a, fx.Node) and a in known  # noqa: E731
    dense: dict[fx.Node, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op == "placeholder" or not any(is_zero(a) for a in node.all_input_nodes):
            continue
        rule = ZERO_RULES.get(node.target) if node.op == "call_function" else None
        result = rule(node, is_zero) if rule is not None else None
        if result is ZERO and not isinstance(val(node), torch.Tensor) and \
                any(u.target is not operator.getitem for u in node.users):
            result = None  # a list of zeros read whole: no dense zeros to stand for it
        if result is ZERO:
            known.add(node)
            name = getattr(node.target, "__name__", str(node.target))
            report.dropped[name] = report.dropped.get(name, 0) + 1
        elif result is not None:
            node.replace_all_uses_with(result)
            report.forwarded += 1
        else:
            _materialize_inputs(gm, node, known, dense, report)
    gm.graph.eliminate_dead_code(is_impure_node=lambda n: n.op in ("placeholder", "output")
                                 or is_mutating(n))
    gm.meta[ZERO_FOLDS] = report
    return recompiled(gm)


def _materialize_inputs(gm: fx.GraphModule, node: fx.Node, known: set, dense: dict,
                        report: ZeroFolds) -> None:
    """The zero inputs of a node no rule folds, replaced by dense zeros made once each."""
    for z in [a for a in node.all_input_nodes if a in known]:
        if z not in dense:
            v = val(z)
            if not isinstance(v, torch.Tensor):
                raise ValueError(f"fold_zero_tangents: {node.name} reads {z.name}, a known "
                                 f"zero that is not one tensor ({type(v).__name__})")
            with gm.graph.inserting_after(z):
                d = gm.graph.call_function(aten.full.default, (list(v.shape), 0), {
                    "dtype": v.dtype, "layout": torch.strided, "device": v.device,
                    "pin_memory": False})
            infer_val(d, fake_mode(gm))
            dense[z] = d
            report.materialized.append(z.name)
        node.replace_input_with(z, dense[z])


def _same_meta(a: object, node: fx.Node) -> bool:
    va, vn = val(a) if isinstance(a, fx.Node) else a, val(node)
    return isinstance(va, torch.Tensor) and isinstance(vn, torch.Tensor) and \
        va.shape == vn.shape and va.dtype == vn.dtype and va.device == vn.device


def _constant_zero(a: object) -> bool:
    """A zeros tensor the graph makes itself (not a tangent): only for rules exact for any
    value of the other operands."""
    if not isinstance(a, fx.Node) or a.op != "call_function":
        return False
    if a.target is aten.zeros.default:
        return True
    return a.target in (aten.full.default, aten.new_full.default) and a.args[-1] == 0 \
        or a.target is aten.new_zeros.default or \
        a.target is aten.scalar_tensor.default and a.args[0] == 0


# -- rules -------------------------------------------------------------------------------------

@register(aten.mm.default, aten.bmm.default, aten.mul.Tensor, aten.mul.Scalar,
          aten.matmul.default, aten.dot.default, aten.mv.default)
def zero_if_any(node: fx.Node, is_zero) -> Optional[_Zero]:
    """Products: linear in each factor, so zero when one factor is a zero tangent."""
    return ZERO


_LINEAR_IN_FIRST = (
    # views and copies
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
    aten.permute.default, aten.t.default, aten.transpose.int, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor,
    aten.select.int, aten.alias.default, aten.clone.default, aten._to_copy.default,
    prims.convert_element_type.default, aten.neg.default, aten.as_strided.default,
    aten.contiguous.default, aten.split.Tensor, aten.split_with_sizes.default,
    aten.unbind.int, aten.chunk.default,
    # reductions and scalings
    aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default,
    aten.div.Tensor, aten.div.Scalar,
    # backward formulas, linear in grad_output (their first argument)
    aten.threshold_backward.default, aten.gelu_backward.default, aten.silu_backward.default,
    aten.sigmoid_backward.default, aten.tanh_backward.default,
    aten._softmax_backward_data.default, aten._log_softmax_backward_data.default,
    aten.embedding_dense_backward.default, aten.native_layer_norm_backward.default,
    aten.native_dropout_backward.default, aten.slice_backward.default,
    aten.select_backward.default, aten.expand_copy.default,
    operator.getitem,
)


@register(*_LINEAR_IN_FIRST)
def zero_if_first(node: fx.Node, is_zero) -> Optional[_Zero]:
    """Views, casts, reductions and grad_output-first backward formulas: zero when their
    first argument is (a divisor or a saved input being zero is no such case)."""
    return ZERO if is_zero(node.args[0]) else None


@register(aten.add.Tensor)
def add(node: fx.Node, is_zero):
    a, b = node.args[:2]
    alpha = node.kwargs.get("alpha", 1)
    if is_zero(a) and (is_zero(b) or _constant_zero(b)) or is_zero(b) and _constant_zero(a):
        return ZERO
    if is_zero(b) and _same_meta(a, node):
        return a
    if is_zero(a) and alpha == 1 and _same_meta(b, node):
        return b
    return None


@register(aten.sub.Tensor)
def sub(node: fx.Node, is_zero):
    a, b = node.args[:2]
    if is_zero(a) and is_zero(b):
        return ZERO
    if is_zero(b) and _same_meta(a, node):
        return a
    return None


@register(aten.addmm.default)
def addmm(node: fx.Node, is_zero):
    """beta * bias + alpha * m1 @ m2: the bias alone when a factor is zero and beta is 1."""
    bias, m1, m2 = node.args[:3]
    product_zero = is_zero(m1) or is_zero(m2)
    if product_zero and (is_zero(bias) or _constant_zero(bias)):
        return ZERO
    if product_zero and node.kwargs.get("beta", 1) == 1 and _same_meta(bias, node):
        return bias
    return None


@register(aten.where.self)
def where(node: fx.Node, is_zero):
    _, a, b = node.args
    zero = lambda x: is_zero(x) or _constant_zero(x)  # noqa: E731
    return ZERO if zero(a) and zero(b) and (is_zero(a) or is_zero(b)) else None


@register(aten.cat.default)
def cat(node: fx.Node, is_zero):
    return ZERO if all(is_zero(t) for t in node.args[0]) else None


@register(aten.slice_scatter.default, aten.select_scatter.default)
def scatter_into_zeros(node: fx.Node, is_zero):
    """zeros.slice_scatter(grad) (slice_backward decomposed): zero when both are."""
    base, src = node.args[:2]
    return ZERO if is_zero(src) and (is_zero(base) or _constant_zero(base)) else None
