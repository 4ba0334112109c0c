"""What each compile did, for `trainc.explain` and TRAINC_DEBUG: one GraphRecord per graph."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch.fx as fx

from trainc import debug
from trainc.codegen import CompiledGraph, KernelInfo
from trainc.config import Config
from trainc.decisions import DecisionRecord
from trainc.graph import GraphSignature, JointGraph
from trainc.partition import Decision, Partition
from trainc.partition.step_peak import StepPeak, predict_step_peak
from trainc.passes import STATS


@dataclass(frozen=True)
class GraphRecord:
    graph_id: int
    training: bool
    backend: str
    signature: GraphSignature
    joint_nodes: int
    fwd_nodes: int
    bwd_nodes: int
    decisions: tuple[Decision, ...]
    saved_bytes: int
    recompute_flops: int
    kernels: tuple[KernelInfo, ...]
    fallback_ops: tuple[str, ...]
    compile_seconds: float
    mode: str = "train"  # "train" (fwd+bwd), "infer" (forward only), "step" (compile_step)
    # (graph name, passes.PassStats): post-grad allocations before/after, reinplaced ops
    passes: tuple = ()
    attention_rewrites: int = 0  # explicit attentions traced as SDPA (trainc/attention.py)
    chunked_losses: int = 0  # LM-head cross-entropies in row chunks (trainc/chunked_loss.py)
    sdpa_rewrites: int = 0  # SDPA calls made causal / GQA (trainc/sdpa_rewrite.py)
    # the artifact cache: "hit", or "miss (why; nearest entry differs in: ...); stored", "off ..."
    cache: str = ""
    # trainc/decisions.py: the choices that shape this graph's code, and the check across
    # ranks ("same on N ranks"; "" when not distributed or off)
    decision_record: Optional[DecisionRecord] = None
    rank_check: str = ""
    # partition/step_peak.py: the step's peak from the wrappers' memory plans (None: aten)
    predicted_peak: Optional[StepPeak] = None
    # the partitioner's notes (e.g. how a memory budget's cap was read and met)
    partition_notes: tuple[str, ...] = ()

    @property
    def decision_hash(self) -> str:
        return self.decision_record.digest if self.decision_record is not None else ""

    @staticmethod
    def make(gid: int, joint: JointGraph, part: Optional[Partition], fwd_gm: fx.GraphModule,
             bwd_gm: Optional[fx.GraphModule], fwd: CompiledGraph, bwd: Optional[CompiledGraph],
             backend: str, seconds: float) -> "GraphRecord":
        compiled = [c for c in (fwd, bwd) if c is not None]
        return GraphRecord(
            graph_id=gid, training=joint.signature.training, backend=backend,
            signature=joint.signature, joint_nodes=_count(joint.gm), fwd_nodes=_count(fwd_gm),
            bwd_nodes=_count(bwd_gm) if bwd_gm is not None else 0,
            decisions=part.decisions if part else (),
            saved_bytes=part.saved_bytes if part else 0,
            recompute_flops=part.recompute_flops if part else 0,
            kernels=tuple(k for c in compiled for k in c.kernels),
            fallback_ops=tuple(sorted({op for c in compiled for op in c.fallback_ops})),
            compile_seconds=seconds, mode="train" if joint.signature.training else "infer",
            passes=pass_stats(fwd=fwd_gm, bwd=bwd_gm),
            attention_rewrites=joint.attention_rewrites, chunked_losses=joint.chunked_losses,
            sdpa_rewrites=joint.sdpa_rewrites, predicted_peak=predict_step_peak(part, fwd, bwd),
            partition_notes=part.notes if part else ())

    def summary(self) -> str:
        return (f"graph_{self.graph_id} {self.mode} backend={self.backend} nodes={self.joint_nodes} "
                f"saved={self.saved_bytes / 2**20:.2f}MiB kernels={len(self.kernels)} "
                f"fallbacks={len(self.fallback_ops)} compile={self.compile_seconds * 1e3:.0f}ms"
                + (f" attention_rewrites={self.attention_rewrites}" if self.attention_rewrites
                   else "")
                + (f" chunked_losses={self.chunked_losses}" if self.chunked_losses else "")
                + (f" sdpa_rewrites={self.sdpa_rewrites}" if self.sdpa_rewrites else "")
                + (f" cache={self.cache}" if self.cache else "")
                + (f" decisions={self.decision_hash[:12]}" if self.decision_record else "")
                + (f" ({self.rank_check})" if self.rank_check else ""))


def pass_stats(**graphs: Optional[fx.GraphModule]) -> tuple:
    """(name, PassStats) for each graph the post-grad passes ran on."""
    return tuple((k, g.meta[STATS]) for k, g in graphs.items()
                 if g is not None and STATS in g.meta)


def allocation_table(graphs: Sequence[GraphRecord]) -> str:
    """Per graph: fresh buffers (count, MiB) before and after the post-grad passes."""
    head = ("graph", "allocs before", "MiB before", "allocs after", "MiB after", "reinplaced")
    rows = [head] + [(f"graph_{g.graph_id}.{name}", str(s.allocs_before),
                      f"{s.bytes_before / 2**20:.3f}", str(s.allocs_after),
                      f"{s.bytes_after / 2**20:.3f}", str(s.reinplaced))
                     for g in graphs for name, s in g.passes]
    return format_table(rows) if len(rows) > 1 else ""


def _count(gm: fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function")


_recorders: list[list[GraphRecord]] = []


class Recording(list):
    """GraphRecords of the compiles in a `recording()` block; `.breaks`: Dynamo's graph-break
    reasons (GraphCompileReason) of the graphs handed to trainc there."""
    def __init__(self):
        super().__init__()
        self.breaks: list = []
        self.regions: list = []  # trainc/layer_regions.py Regions called in the block


def note_region(region) -> None:
    for r in _recorders:
        if not any(x is region for x in r.regions):
            r.regions.append(region)


def note_graph_break(reason) -> None:
    for r in _recorders:
        r.breaks.append(reason)


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Collect the GraphRecords of every compile that happens inside the block."""
    records = Recording()
    _recorders.append(records)
    try:
        yield records
    finally:
        del _recorders[next(i for i, r in enumerate(_recorders) if r is records)]  # nested


def publish(record: GraphRecord, config: Config) -> None:
    for r in _recorders:
        r.append(record)
    if config.debug:
        debug.summary(record.summary())


def decision_table(decisions: Sequence[Decision]) -> str:
    """The per-value partition report: one row per value the backward uses."""
    head = ("name", "action", "op", "shape", "dtype", "bytes", "recompute_flops", "rule")
    rows = [head] + [(d.name, d.action + (" (input)" if d.is_input else "") +
                      (" (host)" if d.offload else ""), d.op, str(d.shape),
                      d.dtype, str(d.nbytes), str(d.recompute_flops), d.rule) for d in decisions]
    return format_table(rows)


def format_table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"
