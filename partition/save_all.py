"""The reference partition: save every forward value the backward reads; recompute nothing."""
from __future__ import annotations

import torch.fx as fx

from trainc.graph import JointGraph
from trainc.partition.split import joint_outputs, tangent_dependent


def choose_save_all(joint: JointGraph) -> list[fx.Node]:
    backward = tangent_dependent(joint.gm)
    _, grad_outs = joint_outputs(joint)
    direct = {g for g in grad_outs if isinstance(g, fx.Node)}
    return [n for n in joint.gm.graph.nodes
            if n.op in ("placeholder", "call_function") and n not in backward
            and (n in direct or any(u in backward for u in n.users))]
