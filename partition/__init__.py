"""Partitioners: a joint graph -> forward graph, backward graph, saved values, decision report.

A partitioner is `choose(joint, costs, config) -> (saved nodes, mode, note)`; `split_joint` does
the rest, so every partitioner yields graphs of the same layout (trainc/graph.py, split.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

import torch.fx as fx

from trainc.config import Config
from trainc.graph import JointGraph, val
from trainc.partition import policy as P
from trainc.partition.budget import BudgetError, Plan, evaluate
from trainc.partition.cost import CostModel
from trainc.partition.memory import MemoryProfile
from trainc.partition.mincut_choose import choose_mincut
from trainc.partition.policy import SavePolicy
from trainc.partition.save_all import choose_save_all
from trainc.partition.split import split_joint
from trainc.partition.tags import RECOMPUTE, SAVE
from trainc.regions import tag_of

Chooser = Callable[[JointGraph, CostModel, Config], tuple[list, str, Optional[str]]]

PARTITIONERS: dict[str, Chooser] = {"save_all": choose_save_all, "mincut": choose_mincut}

__all__ = ["partition", "build_partition", "with_moved", "Partition", "Decision", "SavePolicy", "BudgetError",
           "PARTITIONERS", "observing", "split_joint"]


@dataclass(frozen=True)
class Decision:
    """What the partitioner did with one value the backward uses."""
    name: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int  # bytes saving it keeps alive (its storage; 0 for graph inputs and their views)
    action: str  # "saved" | "recomputed"
    is_input: bool  # graph inputs (parameters, ...) and their views are saved for free
    recompute_flops: int
    rule: str
    storage: str = ""  # node owning the storage: saved views of one base are counted once
    offload: bool = False  # saved in host memory between the forward and the backward


@dataclass(frozen=True)
class Partition:
    fwd: fx.GraphModule  # primals -> [mutated inputs, computed outputs, saved]
    bwd: fx.GraphModule  # [saved, tangents] -> grads
    saved: tuple[str, ...]
    decisions: tuple[Decision, ...]
    memory: Optional[MemoryProfile] = None  # simulated liveness of fwd then bwd
    notes: tuple[str, ...] = ()
    offloaded: tuple[str, ...] = ()  # saved values asked to move to host memory (and back)
    search: str = ""  # a budget's search over predicted plans (budget.search_table), if any

    @property
    def saved_bytes(self) -> int:
        """Activation bytes the forward keeps for the backward (graph inputs not counted)."""
        storages = {d.storage or d.name: d.nbytes for d in self.decisions
                    if d.action == "saved" and not d.is_input}
        return sum(storages.values())

    @property
    def recompute_flops(self) -> int:
        return sum(d.recompute_flops for d in self.decisions if d.action == "recomputed")


_observers: list[list[Partition]] = []


@contextlib.contextmanager
def observing() -> Iterator[list[Partition]]:
    """Collect every Partition made inside the block (for reports)."""
    seen: list[Partition] = []
    _observers.append(seen)
    try:
        yield seen
    finally:
        _observers.remove(seen)


def generates_kernels(config: Config) -> bool:
    """Whether the backend fuses pointwise values away ("auto" is cpp or triton)."""
    return config.backend != "aten"


def partition(joint: JointGraph, config: Config) -> Partition:
    if config.partitioner not in PARTITIONERS:
        raise ValueError(f"trainc: unknown partitioner {config.partitioner!r}; "
                         f"known: {sorted(PARTITIONERS)}")
    policy = getattr(config, "policy", None) or P.DEFAULT_POLICY
    costs = CostModel(joint.gm, policy, fuses=generates_kernels(config))
    saved, mode, note = PARTITIONERS[config.partitioner](joint, costs, config)
    return build_partition(joint, costs, saved, mode, note)


def build_partition(joint: JointGraph, costs: CostModel, saved: list, mode: str,
                    note: Optional[str], observe: bool = True,
                    offload: Iterable[str] = ()) -> Partition:
    """Split the joint graph at `saved` and report every decision (mode: "default", "budget"
    or "save_all", which names the rules in the report). `observe`: `observing()` sees it (a
    budget search's trial partitions are not). `offload`: names of saved values a budget moves
    to host memory; trainc.policy('offload') values are asked too (mode "save_all" aside)."""
    saved = list(dict.fromkeys(_viewed_input(n, costs) or n for n in saved))
    plan = evaluate(joint, costs, saved, mode)
    fwd, bwd = split_joint(joint, saved)
    budgeted = set(offload)
    tagged = set() if mode == "save_all" else set(costs.offload_tags)
    moved = tuple(n.name for n in saved if (n.name in budgeted or n.name in tagged)
                  and costs[n].nbytes > 0 and costs[n].cls != P.INPUT)
    decisions = tuple(_offloaded(d, d.name in tagged) if d.name in moved else d
                      for d in _decisions(plan, costs, mode))
    part = Partition(fwd, bwd, tuple(n.name for n in saved), decisions,
                     plan.memory, (note,) if note else (), moved)
    for seen in _observers if observe else ():
        seen.append(part)
    return part


def with_moved(part: Partition, moved: Iterable[str], why: str) -> Partition:
    """The partition as the codegen carried out its offloads: a value asked to move to host
    memory that stayed on the device says `why`."""
    moved = set(moved)
    decisions = tuple(
        dataclasses.replace(d, offload=False, rule=f"{d.rule}; kept on the device: {why}")
        if d.offload and d.name not in moved else d for d in part.decisions)
    return dataclasses.replace(part, decisions=decisions,
                               offloaded=tuple(n for n in part.offloaded if n in moved))


def _offloaded(d: Decision, tagged: bool) -> Decision:
    rule = ("user policy: trainc.policy('offload') region: saved in host memory" if tagged else
            "budget: saved in host memory (copied out in the forward, back before its backward "
            "use) to meet the peak-memory cap")
    return dataclasses.replace(d, offload=True, rule=rule)


def _viewed_input(n: fx.Node, costs: CostModel) -> Optional[fx.Node]:
    """The graph input a value is a chain of views of, or None. Saving the input instead and
    viewing it again in the backward costs nothing there and saves, per call, a view, an output
    and a saved tensor of the forward (BatchNorm weights as [C, 1, 1])."""
    m = n
    while m.op == "call_function" and costs[m].cls == P.VIEW and m.args \
            and isinstance(m.args[0], fx.Node) and m.args[0] in costs.costs:
        m = m.args[0]
    return m if m is not n and m.op == "placeholder" else None


def _decisions(plan: Plan, costs: CostModel, mode: str) -> tuple[Decision, ...]:
    out = [_decision(n, costs, "saved", _saved_rule(n, costs, mode)) for n in plan.saved]
    out += [_decision(n, costs, "recomputed", _recompute_rule(n, costs, mode))
            for n in plan.recomputed]
    return tuple(out)


def _saved_rule(n: fx.Node, costs: CostModel, mode: str) -> str:
    cls = costs[n].cls
    owner = costs.by_name.get(costs[n].storages[0]) if costs[n].storages else None
    if cls == P.VIEW and owner is not None and owner is not n and owner in costs.costs:
        return f"view of {owner.name}: " + _saved_rule(owner, costs, mode)
    if cls == P.INPUT or costs[n].nbytes == 0:
        return "graph input (or a view of one): saving is free"
    if mode == "save_all":
        return "save_all: every value the backward reads is saved" + \
            (" (trainc.policy regions ignored)" if costs.tags else "")
    tag = costs.tags.get(n)
    if tag == SAVE:
        return "user policy: trainc.policy('save') region, never recomputed"
    if tag == RECOMPUTE:
        return (f"user policy: trainc.policy('recompute') region, but {P.op_name(n)} cannot be "
                f"recomputed ({cls} op, or its inputs cannot be rebuilt): saved")
    if cls == P.NEVER:
        return f"policy: {P.op_name(n)} is never recomputed"
    if cls == P.EXPENSIVE and mode == "default":
        return f"policy: {P.op_name(n)} is expensive, not recomputed without a budget"
    if mode == "default":
        return "min-cut: the fewest bytes on this path to the backward"
    return "budget: saving beats recomputing within the peak-memory cap"


def _recompute_rule(n: fx.Node, costs: CostModel, mode: str) -> str:
    cls = costs[n].cls
    if cls == P.VIEW and costs[n].nbytes == 0:
        return "view of a graph input: the input is saved, the view made again (free)"
    tag = costs.tags.get(n)
    if tag == RECOMPUTE:
        derived = "" if tag_of(n) else " (a backward formula's value read from the region)"
        return f"user policy: trainc.policy('recompute') region{derived}, never saved"
    if cls == P.RANDOM:
        return "random: philox replays the forward's bits from the saved seed"
    if cls == P.EXPENSIVE:
        return "budget: expensive op recomputed to meet the peak-memory cap"
    if mode == "default":
        return f"policy: {cls} op; min-cut: recomputing is cheaper than saving"
    return f"budget: {cls} op recomputed to meet the peak-memory cap"


def _decision(n: fx.Node, costs: CostModel, action: str, rule: str) -> Decision:
    v = val(n)
    c = costs[n]
    shape = tuple(int(s) for s in v.shape) if hasattr(v, "shape") else ()
    dtype = str(v.dtype).replace("torch.", "") if hasattr(v, "dtype") else type(v).__name__
    op = n.op if n.op == "placeholder" else str(n.target)
    is_input = c.cls == P.INPUT or (bool(c.storages) and c.nbytes == 0)
    flops = c.flops if action == "recomputed" else 0
    return Decision(n.name, op, shape, dtype, c.nbytes, action, is_input, flops, rule,
                    c.storages[0] if len(c.storages) == 1 else "")
