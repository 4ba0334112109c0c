"""`with trainc.policy("save" | "recompute" | "offload"):` regions -> a tag on each traced node.

The tag is torch.fx's `node.meta["custom"][KEY]` (fx_traceback.annotate): Dynamo records it on
its graph's nodes, and traces that replay a tagged graph through `replay` keep it, so the joint
graph's forward nodes carry the region their op came from (the partitioner honours it).
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Optional

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback

KEY = "trainc_policy"
SAVE, RECOMPUTE, OFFLOAD = "save", "recompute", "offload"
POLICIES = (SAVE, RECOMPUTE, OFFLOAD)


def policy(name: str) -> ContextManager[None]:
    """Values computed inside the block are saved for the backward ("save": never recomputed),
    recomputed in the backward where legal ("recompute": never saved), or offloaded to host
    memory between the forward and the backward ("offload": saved as "save" is, then copied to
    pinned host memory and back on side streams; the Triton backend on CUDA, elsewhere saved).
    Outside a compiled region the block does nothing."""
    if name not in POLICIES:
        raise ValueError(f"trainc.policy: unknown policy {name!r}; expected one of {POLICIES}")
    if torch.compiler.is_dynamo_compiling():  # Dynamo records the annotation on its nodes
        return fx_traceback.annotate({KEY: name})
    return _traced_region(name)


@contextlib.contextmanager
def _traced_region(name: str):
    """Eager, or make_fx running the user's code (compile_step): nodes made in the block copy
    the annotation only while torch.fx preserves node meta, so preserve it for the block."""
    with fx_traceback.preserve_node_meta(), fx_traceback.annotate({KEY: name}):
        yield


def tag_of(node: fx.Node) -> Optional[str]:
    """The trainc.policy region a node was traced in, or None."""
    custom = node.meta.get("custom")
    return custom.get(KEY) if isinstance(custom, dict) else None


def tagged(gm: fx.GraphModule) -> bool:
    return any(tag_of(n) is not None for n in gm.graph.nodes)


def replay(gm: fx.GraphModule) -> Callable:
    """`gm`'s function, run node by node so that ops traced from it (make_fx,
    functionalization) inherit each node's meta, the region tag included. The plain module
    when nothing is tagged: its generated code runs faster and the traces stay as they were."""
    if not tagged(gm):
        return gm

    def run(*args):
        with fx_traceback.preserve_node_meta():
            return fx.Interpreter(gm).run(*args)

    return run
