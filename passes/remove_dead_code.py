"""Drop nodes whose values nobody uses; random ops are pure here (their seed is an input)."""
import torch.fx as fx


def remove_dead_code(gm: fx.GraphModule) -> fx.GraphModule:
    gm.graph.eliminate_dead_code(is_impure_node=_impure)
    gm.recompile()
    return gm


def _impure(node: fx.Node) -> bool:
    # Functional graphs have no side effects except placeholders (kept for the signature).
    return node.op in ("placeholder", "output")
