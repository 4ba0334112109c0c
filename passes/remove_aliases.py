"""Replace `aten.alias(x)` with x: in a functional graph an alias is the identity.

Output aliasing that users can observe is recorded in the GraphSignature, not in alias nodes.
"""
import torch
import torch.fx as fx

from trainc.passes._graph import recompiled

_ALIAS_OPS = (torch.ops.aten.alias.default, torch.ops.aten.detach.default)


def remove_aliases(gm: fx.GraphModule) -> fx.GraphModule:
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _ALIAS_OPS:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    recompiled(gm)
    return gm
