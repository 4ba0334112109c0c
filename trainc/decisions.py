"""Same decisions on every rank: one compiled graph's choices as plain text, hashed and compared.

A DecisionRecord lists what shapes a graph's code: the resolved Config fields that change it,
the inputs' kinds, dtypes and shapes, the partition's save/recompute choices and budget, the
kernels (the nodes each fuses, its plan), fallbacks and in-place rewrites. Under
torch.distributed (world size > 1) every rank publishes its record's sha256 in the process
group's store and reads the others'; a mismatch raises RankMismatchError on every rank, naming
the first differing decision. The store, not a collective: its wait has a timeout on every
backend (NCCL has no monitored_barrier) and needs no CUDA stream at compile time, so a rank
that never compiles the graph is named after the timeout instead of hanging the others.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

# Config fields that do not change the generated code, or may differ per rank (paths).
_NOT_CODE = frozenset({"debug", "debug_dir", "cache_dir", "cache_artifacts",
                       "triton_compile_workers", "background_compile", "check_mutations",
                       "check_rank_decisions"})


class RankMismatchError(RuntimeError):
    """Ranks compiled a graph differently (or one did not compile it); the message says where."""


@dataclass(frozen=True)
class DecisionRecord:
    """One compiled graph's decisions as (key, value) text pairs in a fixed order; `str()` is
    the canonical text the digest hashes."""
    items: tuple[tuple[str, str], ...]

    @property
    def digest(self) -> str:
        return hashlib.sha256(str(self).encode()).hexdigest()

    def __str__(self) -> str:
        return "".join(f"{k} = {v}\n" for k, v in self.items)


def make(config: Any, inputs: Sequence[tuple[Any, Any]], part: Any,
         graphs: Mapping[str, Any], passes: Sequence = ()) -> DecisionRecord:
    """The record of one graph: `config` resolved, `inputs` (kind, example value) pairs,
    `part` its Partition (or None), `graphs` name -> CompiledGraph (None skipped), `passes`
    GraphRecord.passes."""
    items = [(f"config.{f.name}", canonical(getattr(config, f.name)))
             for f in dataclasses.fields(config) if f.name not in _NOT_CODE]
    items += [(f"input.{i}", f"{getattr(kind, 'name', kind)} {_value(x)}")
              for i, (kind, x) in enumerate(inputs)]
    if part is not None:
        items += [("partition.saved_bytes", str(part.saved_bytes)),
                  ("partition.recompute_flops", str(part.recompute_flops))]
        memory = getattr(part, "memory", None)  # the simulated peak the budget was held to
        if memory is not None:
            items.append(("partition.predicted_peak", str(memory.peak)))
        items += [(f"partition.note.{i}", n) for i, n in enumerate(getattr(part, "notes", ()))]
        # by name: a choice is the same whatever order the partitioner listed it in
        items += [(f"partition.{d.name}", f"{d.action} ({d.rule})")
                  for d in sorted(part.decisions, key=lambda d: d.name)]
    for name, g in graphs.items():
        if g is not None:
            items += _graph_items(name, g)
    items += [(f"passes.{name}.reinplaced", str(s.reinplaced)) for name, s in passes]
    return DecisionRecord(tuple(items))


def canonical(v: Any) -> str:
    """repr with sets sorted and dataclasses spelled out: a frozenset's order follows string
    hashes, which differ per process (PYTHONHASHSEED), so repr would differ across ranks."""
    if isinstance(v, (set, frozenset)):
        return "{" + ", ".join(sorted(map(canonical, v))) + "}"
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(map(canonical, v)) + ")"
    if isinstance(v, dict):
        pairs = sorted(f"{canonical(k)}: {canonical(x)}" for k, x in v.items())
        return "{" + ", ".join(pairs) + "}"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        fields = ", ".join(f"{f.name}={canonical(getattr(v, f.name))}"
                           for f in dataclasses.fields(v))
        return f"{type(v).__name__}({fields})"
    return repr(v)


def _value(x: Any) -> str:
    """An input as the code sees it: the device type only (the index is per rank)."""
    if isinstance(x, torch.Tensor):
        return f"{x.device.type} {str(x.dtype).removeprefix('torch.')} {list(x.shape)}"
    return type(x).__name__


def _graph_items(name: str, g: Any) -> list[tuple[str, str]]:
    items = [(f"{name}.kernel.{k.name}", ", ".join(k.nodes)) for k in g.kernels]
    plans = g.extra.get("kernel_plans", "").split("\n\n")
    if plans[0]:
        items.append((f"{name}.target", plans[0]))
    items += [(f"{name}.plan.{p.split(':', 1)[0]}", p) for p in plans[1:]]
    items.append((f"{name}.fallbacks", ", ".join(g.fallback_ops)))
    memory = g.extra.get("memory_plan")  # codegen/memory: its summary and in-place choices
    if memory is not None:
        items.append((f"{name}.memory_plan", str(memory).split("\n", 1)[0]))
        items += [(f"{name}.inplace.{x}", t) for x, t in memory.storage]
    return items


# -- the check across ranks ------------------------------------------------------------------
_rounds: dict[str, int] = {}  # group name -> graphs checked in it (the store keys' round)
checks = 0  # graphs this process checked against its peers (tests read it)


def default_group() -> Optional[Any]:
    """trainc.compile's group: the default one, when torch.distributed runs on > 1 rank."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None


def check_ranks(record: Any, config: Any, group: Optional[Any]) -> Any:
    """`record` (a GraphRecord with its decision_record) with `rank_check` set, after every rank
    of `group` showed the same digest; RankMismatchError otherwise. No group, one rank, or
    Config.check_rank_decisions False: the record unchanged."""
    if group is None or record.decision_record is None or not config.check_rank_decisions:
        return record
    dist = torch.distributed
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world < 2:
        return record
    global checks
    name = f"graph_{record.graph_id} ({record.mode})"
    store = dist.distributed_c10d._get_process_group_store(group)
    n = _rounds[group.group_name] = _rounds.get(group.group_name, 0) + 1
    mine = json.dumps([name, record.decision_record.digest])
    theirs = _exchange(store, f"trainc.decisions/{n}/digest", rank, world, mine, name)
    checks += 1
    if len(set(json.loads(t)[1] for t in theirs)) == 1:
        return dataclasses.replace(record, rank_check=f"same on {world} ranks")
    texts = _exchange(store, f"trainc.decisions/{n}/record", rank, world,
                      json.dumps(record.decision_record.items), name)
    raise RankMismatchError(mismatch_message([json.loads(t)[0] for t in theirs],
                                             [tuple(map(tuple, json.loads(t))) for t in texts]))


def _exchange(store: Any, prefix: str, rank: int, world: int, value: str, name: str) -> list:
    """Every rank's value under prefix/<rank>, after waiting for all (the store's timeout)."""
    store.set(f"{prefix}/{rank}", value)
    keys = [f"{prefix}/{r}" for r in range(world)]
    try:
        store.wait(keys, store.timeout)
    except Exception as e:  # DistStoreError / RuntimeError on timeout, by store type
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise RankMismatchError(
            f"trainc: rank {rank} compiled {name}, but rank(s) {missing} did not compile a graph "
            f"there within {store.timeout} (the process group's timeout): the ranks run "
            "different programs or inputs (shapes, a recompile on one rank), so their "
            "collectives would hang. Give every rank the same shapes, or turn this check off "
            f"with check_rank_decisions=False. ({type(e).__name__}: {e})") from None
    return [store.get(k).decode() for k in keys]


def mismatch_message(names: Sequence[str], records: Sequence[Sequence[tuple]]) -> str:
    """The first decision (in record order) where some rank differs from rank 0, each rank's
    value of it, and how many decisions differ in all."""
    tables = [dict(r) for r in records]
    keys = list(dict.fromkeys(k for r in records for k, _ in r))
    differ = [k for k in keys if len({t.get(k) for t in tables}) > 1]
    graphs = ", ".join(f"rank {r}: {n}" for r, n in enumerate(names))
    if not differ:  # same items, different digests: cannot happen unless the text is unstable
        return f"trainc: ranks disagree on the decision hash of {graphs}, with equal records"
    first = differ[0]
    values = "\n".join(f"  rank {r}: {t.get(first, '<absent>')}" for r, t in enumerate(tables))
    more = ", ".join(differ[1:6]) + (", ..." if len(differ) > 6 else "")
    return (f"trainc: ranks compiled different code for one graph ({graphs}); first differing "
            f"decision {first!r} ({len(differ)} differ in all):\n{values}\n"
            + (f"  also: {more}\n" if more else "") +
            "Every rank must make the same partition, budget, fusion and kernel choices, or "
            "their collectives disagree. Give every rank the same options (memory_budget, "
            "backend, ...) and inputs, or turn this check off with check_rank_decisions=False.")
