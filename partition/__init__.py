"""Partitioners: a joint graph -> forward graph, backward graph, saved values, decision report.

A partitioner is a function `choose(joint) -> saved nodes`; `split_joint` does the rest, so every
partitioner yields graphs of the same layout (see trainc/graph.py and partition/split.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.fx as fx

from trainc.config import Config
from trainc.graph import JointGraph, nbytes, val
from trainc.partition.save_all import choose_save_all
from trainc.partition.split import split_joint

Chooser = Callable[[JointGraph], list]

PARTITIONERS: dict[str, Chooser] = {"save_all": choose_save_all}


@dataclass(frozen=True)
class Decision:
    """What the partitioner did with one value the backward uses."""
    name: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    action: str  # "saved" | "recomputed"
    is_input: bool  # graph inputs (parameters, ...) are saved for free
    recompute_flops: int
    rule: str


@dataclass(frozen=True)
class Partition:
    fwd: fx.GraphModule  # primals -> [mutated inputs, computed outputs, saved]
    bwd: fx.GraphModule  # [saved, tangents] -> grads
    saved: tuple[str, ...]
    decisions: tuple[Decision, ...]

    @property
    def saved_bytes(self) -> int:
        """Activation bytes the forward keeps for the backward (graph inputs not counted)."""
        return sum(d.nbytes for d in self.decisions if d.action == "saved" and not d.is_input)

    @property
    def recompute_flops(self) -> int:
        return sum(d.recompute_flops for d in self.decisions if d.action == "recomputed")


def partition(joint: JointGraph, config: Config) -> Partition:
    if config.partitioner not in PARTITIONERS:
        raise ValueError(f"trainc: unknown partitioner {config.partitioner!r}; "
                         f"known: {sorted(PARTITIONERS)}")
    if config.memory_budget is not None and config.partitioner == "save_all":
        raise NotImplementedError("trainc: memory_budget needs the min-cut partitioner, which "
                                  "is not available yet; pass memory_budget=None")
    saved = PARTITIONERS[config.partitioner](joint)
    fwd, bwd = split_joint(joint, saved)
    decisions = tuple(_decision(n, "saved", config.partitioner) for n in saved)
    return Partition(fwd, bwd, tuple(n.name for n in saved), decisions)


def _decision(n: fx.Node, action: str, rule: str, flops: int = 0) -> Decision:
    v = val(n)
    shape = tuple(v.shape) if hasattr(v, "shape") else ()
    dtype = str(v.dtype).replace("torch.", "") if hasattr(v, "dtype") else type(v).__name__
    op = n.op if n.op == "placeholder" else str(n.target)
    return Decision(n.name, op, shape, dtype, nbytes(v), action, n.op == "placeholder", flops, rule)
