"""Drop nodes whose values nobody uses; random ops are pure here (their seed is an input).

Nodes that write a buffer (introduced by reinplace_ops) are kept: their effect is the write.
"""
import torch.fx as fx

from trainc.passes._graph import is_mutating, recompiled


def remove_dead_code(gm: fx.GraphModule) -> fx.GraphModule:
    gm.graph.eliminate_dead_code(is_impure_node=_impure)
    recompiled(gm)
    return gm


def _impure(node: fx.Node) -> bool:
    return node.op in ("placeholder", "output") or is_mutating(node)
