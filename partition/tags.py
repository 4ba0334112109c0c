"""trainc.policy regions in a joint graph -> the tag of each forward value the partitioner honours.

"save": never recomputed (saved wherever the backward needs it, directly or to recompute
another value). "offload": saved as "save" is, then moved to host memory between the forward
and the backward where the backend can (`offload_tagged`; the Triton backend). "recompute": never saved where recomputing is legal (`recompute_legal`), else
saved, and the report says why. A value only backward formulas need (it is neither
tangent-dependent nor needed by a forward output) that reads a "recompute" value is
"recompute" too: saving it would keep the region's activations in another form.
"""
from __future__ import annotations

import torch.fx as fx

from trainc.graph import val
from trainc.regions import OFFLOAD, RECOMPUTE, SAVE, tag_of
from trainc.partition import policy as P
from trainc.partition.split import tangent_dependent

__all__ = ["user_tags", "offload_tagged", "recompute_legal", "SAVE", "RECOMPUTE"]


def user_tags(gm: fx.GraphModule) -> dict[fx.Node, str]:
    """Tag of every tagged forward call_function node ("offload" reads as "save" here)."""
    backward = tangent_dependent(gm)
    outs = [o for o in gm.graph.output_node().args[0]
            if isinstance(o, fx.Node) and o not in backward]
    needed = _ancestors(outs)
    tags: dict[fx.Node, str] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n in backward:
            continue
        tag = tag_of(n)
        if tag is None and n not in needed and \
                any(tags.get(a) == RECOMPUTE for a in n.all_input_nodes):
            tag = RECOMPUTE
        if tag is not None:
            tags[n] = tag
    return {n: SAVE if t == OFFLOAD else t for n, t in tags.items()}


def offload_tagged(gm: fx.GraphModule) -> frozenset[str]:
    """Names of the forward values inside trainc.policy('offload') regions."""
    backward = tangent_dependent(gm)
    return frozenset(n.name for n in gm.graph.nodes if n.op == "call_function" and
                     n not in backward and tag_of(n) == OFFLOAD)


def recompute_legal(n: fx.Node, policy: P.SavePolicy) -> bool:
    """Whether a "recompute" tag can be honoured: the op class allows recomputation (budgets
    included) and the backward can rebuild its inputs (saved, or recomputed themselves; a
    multi-output op that may not be recomputed cannot be saved whole either)."""
    if not policy.recomputable(n, True):
        return False
    for a in n.all_input_nodes:
        whole = not isinstance(val(a), (tuple, list))
        if a.op == "call_function" and not whole and not policy.recomputable(a, True):
            return False
    return True


def _where(n: fx.Node) -> str:
    trace = n.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().startswith("File")]
    return f", traced at {lines[-1]}" if lines else ""


def _ancestors(outputs: list) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    work = list(outputs)
    while work:
        n = work.pop()
        if n not in seen:
            seen.add(n)
            work.extend(n.all_input_nodes)
    return seen
