"""Simulated memory of a partition: liveness of storages over the forward's then the backward's
execution order. Counted: the activation memory a partition controls (saved values,
temporaries, recomputed values). Not counted: graph inputs (parameters, user inputs, tangents)
and, after their last use inside the graph, its outputs (user outputs, gradients): they are
handed over and are the same for every partition. A storage is allocated by its first node.

Fused values are not counted either: codegen inlines a pointwise value (or the full-size output
of a softmax or norm) into the kernels that read it, so it never takes memory unless it is
saved, is a graph output, or feeds an extern op (a matmul, a convolution, a fallback). Counting
them made recompute look costly and saving look cheap: budget plans that saved more measured
up to 3x the default plan's peak on the GPU (normact).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch.fx as fx

from trainc.partition import policy as P
from trainc.partition.cost import CostModel


@dataclass(frozen=True)
class MemoryProfile:
    saved_bytes: int  # distinct storages the forward hands to the backward
    fwd_peak: int
    bwd_peak: int

    @property
    def peak(self) -> int:
        return max(self.fwd_peak, self.bwd_peak)


def simulate(costs: CostModel, fwd: Sequence[fx.Node], bwd: Sequence[fx.Node],
             fwd_outputs: Iterable, saved: Sequence[fx.Node],
             grad_outputs: Iterable) -> MemoryProfile:
    saved_storages = _storages(costs, saved)
    saved_bytes = sum(costs.storage_bytes[s] for s in saved_storages)
    fused = set()
    if costs.fuses:
        fused = fused_storages(costs, [*fwd, *bwd], [*fwd_outputs, *grad_outputs]) - saved_storages
    fwd_peak = _run(costs, fwd, set(), saved_storages, fused)
    bwd_peak = _run(costs, bwd, saved_storages, set(), fused)
    return MemoryProfile(saved_bytes, fwd_peak, bwd_peak)


def _storages(costs: CostModel, nodes: Iterable) -> set[str]:
    out: set[str] = set()
    for n in nodes:
        if isinstance(n, fx.Node) and n in costs.costs:
            out.update(s for s in costs[n].storages if s not in costs.input_storages)
    return out


def fused_storages(costs: CostModel, nodes: Sequence[fx.Node], outputs: Iterable) -> set[str]:
    """Storages codegen never allocates: pointwise values (and full-size softmax/norm outputs)
    that no graph output and no extern op reads."""
    materialized = _storages(costs, [o for o in outputs if isinstance(o, fx.Node)])
    for n in nodes:
        if costs[n].cls in (P.EXPENSIVE, P.NEVER):
            materialized |= _storages(costs, n.all_input_nodes)
    fused = set()
    for n in nodes:
        c = costs[n]
        for s in c.storages:
            owner = costs.by_name.get(s.split("[")[0])  # "name[i]": a tuple output's i-th
            if s in materialized or s in costs.input_storages or owner is not n:
                continue
            if c.cls in (P.CHEAP, P.RANDOM) or (c.cls == P.REDUCTION and
                                               costs.storage_bytes[s] >= _largest_input(costs, n)):
                fused.add(s)
    return fused


def _largest_input(costs: CostModel, n: fx.Node) -> int:
    return max((costs.storage_bytes[s] for a in n.all_input_nodes for s in costs[a].storages),
               default=0)


def _run(costs: CostModel, order: Sequence[fx.Node], live_in: set[str],
         keep: set[str], fused: set[str]) -> int:
    """Peak bytes while running `order` starting with `live_in` live; `keep` outlives it;
    `fused` storages are never allocated."""
    last: dict[str, int] = {}
    for i, n in enumerate(order):
        for m in (n, *n.all_input_nodes):
            for s in costs[m].storages:
                last[s] = i
    live = {s for s in live_in}
    size = costs.storage_bytes
    cur = sum(size[s] for s in live)
    peak = cur
    frees: dict[int, list[str]] = {}
    for s, i in last.items():
        if s not in keep and s not in costs.input_storages:
            frees.setdefault(i, []).append(s)
    for s in live_in:  # saved values the backward never reads die at once
        if s not in last and s not in keep:
            live.discard(s)
            cur -= size[s]
    for i, n in enumerate(order):
        for s in costs[n].storages:
            if s not in live and s not in costs.input_storages and s not in fused:
                live.add(s)
                cur += size[s]
        peak = max(peak, cur)
        for s in frees.get(i, ()):
            if s in live:
                live.discard(s)
                cur -= size[s]
    return peak
