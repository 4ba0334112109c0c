"""Declarative rewrites: a pattern function of ATen ops -> a replacement function, matched
structurally at the pattern's output. Backends add rules with `register_rewrite`.

A rewrite applies only when the replacement's value has the matched node's layout and, if it
returns an existing node, no graph output aliases the matched one; new nodes get meta["val"].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.fx as fx

from trainc.passes._graph import (fake_mode, infer_val, output_aliases, recompiled,
                                  same_layout)
from trainc.graph import val

aten = torch.ops.aten


@dataclass(frozen=True)
class Rewrite:
    name: str
    pattern: fx.Graph  # placeholders match any value; call nodes match by target and arguments
    replacement: fx.Graph  # same placeholders (by position) as the pattern
    check: Optional[Callable[[dict[str, Any]], bool]] = None  # bindings -> apply?


RULES: list[Rewrite] = []


def register_rewrite(pattern: Callable, replacement: Callable, *, name: str = "",
                     check: Optional[Callable[[dict[str, Any]], bool]] = None) -> Rewrite:
    """Add a rule; `pattern` and `replacement` are functions of the same parameters that call
    torch.ops.aten ops (traced with torch.fx.symbolic_trace)."""
    rule = Rewrite(name or pattern.__name__, fx.symbolic_trace(pattern).graph,
                   fx.symbolic_trace(replacement).graph, check)
    RULES.append(rule)
    return rule


def rewrite_patterns(gm: fx.GraphModule, rules: Optional[list[Rewrite]] = None) -> fx.GraphModule:
    rules = RULES if rules is None else rules
    protected, mode = output_aliases(gm.graph), fake_mode(gm)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not node.users and node not in protected:
            continue
        for rule in rules:
            bindings: dict[str, Any] = {}
            if _match(rule.pattern.output_node().args[0], node, bindings) and \
                    (rule.check is None or rule.check(bindings)) and \
                    _apply(gm, rule, node, bindings, protected, mode):
                break
    gm.graph.eliminate_dead_code()
    recompiled(gm)
    return gm


def _match(p: Any, g: Any, bindings: dict[str, Any]) -> bool:
    if isinstance(p, fx.Node) and p.op == "placeholder":
        if p.target in bindings:
            return bindings[p.target] is g or (not isinstance(g, fx.Node)
                                               and _same_literal(bindings[p.target], g))
        bindings[p.target] = g
        return True
    if isinstance(p, fx.Node):
        return (isinstance(g, fx.Node) and g.op == "call_function" and g.target == p.target
                and len(g.args) == len(p.args) and set(g.kwargs) == set(p.kwargs)
                and all(_match(a, b, bindings) for a, b in zip(p.args, g.args))
                and all(_match(p.kwargs[k], g.kwargs[k], bindings) for k in p.kwargs))
    if isinstance(p, (list, tuple)):
        return isinstance(g, (list, tuple)) and len(p) == len(g) and \
            all(_match(a, b, bindings) for a, b in zip(p, g))
    return _same_literal(p, g)


def _same_literal(a: Any, b: Any) -> bool:
    return type(a) is type(b) and (a == b or (isinstance(a, float) and str(a) == str(b)))


def _apply(gm, rule: Rewrite, node: fx.Node, bindings: dict, protected: set, mode) -> bool:
    env: dict[fx.Node, Any] = {}
    new: list[fx.Node] = []
    placeholders = [n for n in rule.replacement.nodes if n.op == "placeholder"]
    pattern_names = [n.target for n in rule.pattern.nodes if n.op == "placeholder"]
    for ph, name in zip(placeholders, pattern_names):
        env[ph] = bindings.get(name)
    with gm.graph.inserting_before(node):
        for r in rule.replacement.nodes:
            if r.op == "call_function":
                env[r] = gm.graph.call_function(r.target, *fx.node.map_aggregate(
                    (r.args, r.kwargs), lambda a: env[a] if isinstance(a, fx.Node) else a))
                new.append(env[r])
                infer_val(env[r], mode)
    result = env[rule.replacement.output_node().args[0]]
    ok = isinstance(result, fx.Node) and same_layout(val(result), val(node)) and \
        (result in new or node not in protected)
    if ok:
        node.replace_all_uses_with(result)
    for n in reversed(new):
        if not n.users and n is not result or not ok:
            gm.graph.erase_node(n)
    return ok


def _double_neg(x):
    return aten.neg.default(aten.neg.default(x))


def _double_not(x):
    return aten.bitwise_not.default(aten.bitwise_not.default(x))


def _mul_minus_one(x):
    return aten.mul.Tensor(x, -1)


def _identity(x):
    return x


def _neg(x):
    return aten.neg.default(x)


register_rewrite(_double_neg, _identity, name="neg(neg(x)) -> x")
register_rewrite(_double_not, _identity, name="not(not(x)) -> x")
register_rewrite(_mul_minus_one, _neg, name="x * -1 -> neg(x)",
                 check=lambda b: isinstance(val(b["x"]), torch.Tensor)
                 and val(b["x"]).is_floating_point())
