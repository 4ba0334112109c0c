"""Cost model of a joint graph: bytes each value keeps alive, FLOPs and recompute cost of each op.

Bytes are storage bytes from node.meta["val"]: a view keeps its base's storage alive, and graph
inputs (parameters, user inputs, the seed) and views of them cost nothing to keep.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.flop_counter import flop_registry

from trainc.graph import val
from trainc.partition import policy as P
from trainc.partition.tags import offload_tagged, user_tags

# Rough per-element FLOPs of ops without a torch.utils.flop_counter formula.
_PHILOX_FLOPS_PER_ELEMENT = 40  # 10 rounds of 2 multiplies, xors and key bumps
_NORM_FLOPS_PER_ELEMENT = 5


@dataclass(frozen=True)
class NodeCost:
    cls: str  # the policy's op class
    storages: tuple[str, ...]  # names of the nodes owning the storages this value lives in
    nbytes: int  # bytes saving this value keeps alive (0 for graph inputs and their views)
    flops: int  # estimated FLOPs to compute the value once
    recompute: int  # recompute cost in byte-equivalents: max(flops / flops_per_byte, written)


class CostModel:
    """Per-node costs of one graph; `storage_bytes[name]` is each storage's size; `tags` the
    trainc.policy region of each tagged forward value (partition/tags.py)."""

    def __init__(self, gm: fx.GraphModule, policy: P.SavePolicy, fuses: bool = False):
        self.policy = policy
        self.fuses = fuses  # the backend generates fused kernels (partition/memory.py)
        self.owner: dict[StorageWeakRef, str] = {}
        self.storage_bytes: dict[str, int] = {}
        self.input_storages: set[str] = set()
        self.costs: dict[fx.Node, NodeCost] = {}
        self.by_name: dict[str, fx.Node] = {}
        self.tags = user_tags(gm)
        self.offload_tags = offload_tagged(gm)  # "save" tags that also ask for host memory
        self.cut_cache: dict = {}  # partition/mincut.py: flow-graph pieces and their cuts
        for n in gm.graph.nodes:
            self.by_name[n.name] = n
            if n.op in ("placeholder", "get_attr", "call_function"):
                self.costs[n] = self._cost(n)

    def __getitem__(self, node: fx.Node) -> NodeCost:
        return self.costs[node]

    def _cost(self, n: fx.Node) -> NodeCost:
        storages = tuple(self._storage(n, i, t) for i, t in enumerate(_tensors(val(n))))
        if n.op in ("placeholder", "get_attr"):  # inputs and tensor constants: always alive
            self.input_storages.update(storages)
        nbytes = sum(self.storage_bytes[s] for s in set(storages) if s not in self.input_storages)
        cls = self.policy.classify(n)
        flops = 0 if cls in (P.INPUT, P.VIEW) else node_flops(n, cls)
        written = 0 if cls in (P.INPUT, P.VIEW) else sum(_logical_bytes(t)
                                                       for t in _tensors(val(n)))
        recompute = max(int(flops / self.policy.flops_per_byte), written)
        return NodeCost(cls, storages, nbytes, flops, recompute)

    def _storage(self, n: fx.Node, i: int, t: torch.Tensor) -> str:
        ref = StorageWeakRef(t.untyped_storage())
        if ref not in self.owner:
            key = n.name if isinstance(val(n), torch.Tensor) else f"{n.name}[{i}]"
            self.owner[ref] = key
            self.storage_bytes[key] = int(t.untyped_storage().nbytes())
        return self.owner[ref]


def node_flops(n: fx.Node, cls: str) -> int:
    """FLOPs of one op: torch.utils.flop_counter formulas for matmul/conv/attention, else a
    per-element estimate (pointwise: outputs; reductions: inputs)."""
    target = n.target
    packet = getattr(target, "overloadpacket", None)
    if packet is not None and packet in flop_registry:
        args, kwargs = fx.node.map_arg((n.args, n.kwargs), val)
        try:
            return int(flop_registry[packet](*args, **kwargs, out_val=val(n)))
        except Exception:  # a formula that rejects these arguments: fall back to element counts
            pass
    out_numel = sum(int(t.numel()) for t in _tensors(val(n)))
    in_numel = max((int(t.numel()) for a in n.all_input_nodes for t in _tensors(val(a))),
                   default=0)
    if cls == P.RANDOM:
        return _PHILOX_FLOPS_PER_ELEMENT * out_numel
    if cls in (P.REDUCTION, P.EXPENSIVE):
        per = _NORM_FLOPS_PER_ELEMENT if "norm" in P.op_name(n) else 1
        return per * max(in_numel, out_numel)
    return out_numel


def _tensors(v) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    return []


def _logical_bytes(t: torch.Tensor) -> int:
    return int(t.numel()) * t.element_size()
