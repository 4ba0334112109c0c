"""The reference partition: save every forward value the backward reads; recompute nothing."""
from __future__ import annotations

from typing import Optional

import torch.fx as fx

from trainc.config import Config
from trainc.graph import JointGraph
from trainc.partition.cost import CostModel
from trainc.partition.split import joint_outputs, tangent_dependent


def save_all_nodes(joint: JointGraph) -> list[fx.Node]:
    backward = tangent_dependent(joint.gm)
    _, grad_outs = joint_outputs(joint)
    direct = {g for g in grad_outs if isinstance(g, fx.Node)}
    return [n for n in joint.gm.graph.nodes
            if n.op in ("placeholder", "call_function") and n not in backward
            and (n in direct or any(u in backward for u in n.users))]


def choose_save_all(joint: JointGraph, costs: CostModel,
                    config: Config) -> tuple[list[fx.Node], str, Optional[str]]:
    if config.memory_budget is not None:
        raise ValueError("trainc: memory_budget needs partitioner='mincut' (save_all saves "
                         "everything the backward reads)")
    return save_all_nodes(joint), "save_all", None
