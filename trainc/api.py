"""Public entry points: trainc.compile and trainc.explain."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from trainc import layer_regions, records
from trainc.capture import dynamo_backend
from trainc.codegen import KernelInfo, prestart_for
from trainc.config import make_config
from trainc.partition import Decision


def compile(model_or_fn: Callable, *, backend: str = "auto", memory_budget: Any = None,
            **options: Any) -> Callable:
    """Compile a model or function for training; returns a callable with the same signature."""
    if not callable(model_or_fn):
        raise TypeError(f"trainc.compile expects an nn.Module or a function, "
                        f"got {type(model_or_fn).__name__}")
    config = make_config(backend, memory_budget, **options)
    prestart_for(model_or_fn, config)  # Triton compile workers, for a CUDA module
    backend = functools.partial(dynamo_backend, config=config)
    token = layer_regions.install(model_or_fn, lambda region: backend) \
        if config.regions and isinstance(model_or_fn, torch.nn.Module) else None
    # Static shapes: a new shape recompiles (Dynamo guards) rather than going symbolic.
    compiled = torch.compile(model_or_fn, backend=backend, dynamic=False)
    if token is not None:  # the regions run compiled only inside this callable's calls
        compiled.forward = layer_regions.activate(compiled.forward, token)
    return compiled


@dataclass(frozen=True)
class GraphBreak:
    """Where Dynamo split the user's code into several graphs, and why."""
    reason: str  # Dynamo's first line, e.g. "Call to `torch._dynamo.graph_break()`"
    filename: str
    lineno: int

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}: {self.reason}"


@dataclass(frozen=True)
class Explanation:
    graphs: tuple[records.GraphRecord, ...]
    graph_breaks: tuple[GraphBreak, ...] = ()
    # Config.regions: each region's instances, calls and the graphs compiled for it (a repeated
    # group's one graph serves all its layers)
    regions: tuple[layer_regions.Region, ...] = ()

    @property
    def runs(self) -> dict[int, int]:
        """Graph id -> runs in the explained call: a region's graph runs once per layer calling
        it (Config.regions); every other graph once."""
        out = {g.graph_id: 1 for g in self.graphs}
        for r in self.regions:
            for gid in r.graph_ids:
                out[gid] = max(1, r.calls // len(r.graph_ids))
        return out

    @property
    def saved_bytes(self) -> int:
        """Activation bytes saved for backward over the call: a graph's times its runs."""
        runs = self.runs
        return sum(g.saved_bytes * runs.get(g.graph_id, 1) for g in self.graphs)

    @property
    def saved_tensors(self) -> list[Decision]:
        """The activations saved for backward (graph inputs such as parameters excluded)."""
        return [d for g in self.graphs for d in g.decisions if d.action == "saved"
                and not d.is_input]

    @property
    def host_bytes(self) -> int:
        """Of saved_bytes, those kept in host memory between forward and backward (offload)."""
        runs = self.runs
        return sum(d.nbytes * runs.get(g.graph_id, 1) for g in self.graphs
                   for d in g.decisions if d.offload)

    @property
    def recompute_flops(self) -> int:
        return sum(g.recompute_flops for g in self.graphs)

    @property
    def kernels(self) -> list[KernelInfo]:
        return [k for g in self.graphs for k in g.kernels]

    @property
    def fallback_ops(self) -> list[str]:
        return sorted({op for g in self.graphs for op in g.fallback_ops})

    @property
    def reinplaced_ops(self) -> int:
        """Functional ops the post-grad passes rewrote in place, over all graphs."""
        return sum(s.reinplaced for g in self.graphs for _, s in g.passes)

    @property
    def attention_rewrites(self) -> int:
        """Explicit softmax attentions traced as scaled_dot_product_attention."""
        return sum(g.attention_rewrites for g in self.graphs)

    @property
    def chunked_losses(self) -> int:
        """LM-head cross-entropies traced in row chunks (Config.chunk_loss)."""
        return sum(g.chunked_losses for g in self.graphs)

    @property
    def sdpa_rewrites(self) -> int:
        """SDPA calls given is_causal for a constant causal mask or enable_gqa for repeated
        KV heads (Config.sdpa_rewrite)."""
        return sum(g.sdpa_rewrites for g in self.graphs)

    @property
    def predicted_peak(self) -> Optional[int]:
        """The step's predicted peak in bytes, summed over graphs (partition/step_peak.py: the
        wrappers' memory plans, saved activations, held outputs, gradients); None when a graph
        has no memory plan (the aten backend) or when a graph runs more than once per call
        (Config.regions: the graphs' peaks are per run and do not add up to the step's)."""
        if any(n > 1 for n in self.runs.values()):
            return None
        peaks = [g.predicted_peak for g in self.graphs if g.training]
        return sum(p.peak for p in peaks) if peaks and None not in peaks else None

    @property
    def compile_seconds(self) -> float:
        return sum(g.compile_seconds for g in self.graphs)

    def table(self, per_value: bool = False) -> str:
        head = ("graph", "mode", "backend", "runs", "nodes", "fwd", "bwd", "saved", "saved MiB",
                "recompute MFLOP", "kernels", "fallbacks", "compile s")
        rows = [head] + [(
            f"graph_{g.graph_id}", g.mode, g.backend, str(self.runs.get(g.graph_id, 1)),
            str(g.joint_nodes), str(g.fwd_nodes), str(g.bwd_nodes),
            str(sum(1 for d in g.decisions if d.action == "saved" and not d.is_input)),
            f"{g.saved_bytes / 2**20:.3f}", f"{g.recompute_flops / 1e6:.1f}",
            str(len(g.kernels)), str(len(g.fallback_ops)), f"{g.compile_seconds:.2f}")
            for g in self.graphs]
        text = records.format_table(rows)
        host = f" ({self.host_bytes / 2**20:.3f} in host memory)" if self.host_bytes else ""
        text += (f"total: {len(self.graphs)} graph(s), saved {self.saved_bytes / 2**20:.3f} MiB"
                 f"{host} (graph x runs) in {len(self.saved_tensors)} tensors (per graph), "
                 f"recompute {self.recompute_flops / 1e6:.1f}"
                 f" MFLOP, {len(self.kernels)} kernels, {len(self.fallback_ops)} fallback ops, "
                 f"compile {self.compile_seconds:.2f} s\n")
        if self.attention_rewrites:
            text += (f"attention: {self.attention_rewrites} explicit softmax attention(s) traced "
                     "as scaled_dot_product_attention\n")
        if self.chunked_losses:
            text += (f"loss: {self.chunked_losses} LM-head cross-entropy(ies) computed in row "
                     "chunks (chunk_loss)\n")
        if self.sdpa_rewrites:
            text += (f"attention: {self.sdpa_rewrites} scaled_dot_product_attention call(s) made "
                     "causal (constant causal mask) or GQA (repeated KV heads) (sdpa_rewrite)\n")
        if self.fallback_ops:
            text += "fallback ops: " + ", ".join(self.fallback_ops) + "\n"
        for b in self.graph_breaks:
            text += f"graph break: {b}\n"
        for r in self.regions:
            text += f"{r}\n"
        for g in self.graphs:  # the artifact cache: hit, or which key part missed
            text += f"graph_{g.graph_id} cache: {g.cache}\n" if g.cache else ""
        for g in self.graphs:  # trainc/decisions.py: compared across ranks when distributed
            text += (f"graph_{g.graph_id} decisions: sha256 {g.decision_hash[:16]}"
                     + (f" ({g.rank_check})" if g.rank_check else "") + "\n"
                     if g.decision_record else "")
        for g in self.graphs:
            text += f"graph_{g.graph_id} {g.predicted_peak}\n" if g.predicted_peak else ""
            text += "".join(f"graph_{g.graph_id} {n}\n" for n in g.partition_notes)
        text += records.allocation_table(self.graphs)
        if per_value:
            for g in self.graphs:
                if g.decisions:
                    text += f"\ngraph_{g.graph_id} partition decisions:\n"
                    text += records.decision_table(g.decisions)
        return text

    def __str__(self) -> str:
        return self.table()


def explain(model_or_fn: Callable, *args: Any, **compile_options: Any) -> Explanation:
    """Compile and run once on `args`; report graphs, saved activations, kernels, fallbacks.

    Module state (parameters, buffers) and torch's RNG state are restored afterwards, so
    explaining a model does not advance its BatchNorm statistics or the random stream.
    """
    compiled = compile(model_or_fn, **compile_options)
    state = _snapshot(model_or_fn)
    rng_state = torch.get_rng_state()
    try:
        with records.recording() as recs:
            compiled(*args)
    finally:
        torch.set_rng_state(rng_state)
        _restore(model_or_fn, state)
    if not recs:
        raise RuntimeError(
            "trainc.explain: nothing was compiled, so there is nothing to report. Either "
            f"{getattr(model_or_fn, '__name__', type(model_or_fn).__name__)} ran no tensor "
            "operations, or Dynamo ran it eagerly: it stops compiling a function (or a module "
            "class's forward) after torch._dynamo.config.recompile_limit "
            f"({torch._dynamo.config.recompile_limit}) compilations with different options or "
            "instances in one process; call torch._dynamo.reset() before explaining again.")
    return Explanation(tuple(recs), _graph_breaks(recs.breaks),
                       tuple(dataclasses.replace(r) for r in recs.regions))


def _graph_breaks(reasons) -> tuple[GraphBreak, ...]:
    """Dynamo's graph-break reasons, each at the user's line that caused it."""
    out = []
    for r in reasons:
        stack = list(r.user_stack or [])
        frame = stack[-1] if stack else None
        out.append(GraphBreak(r.reason.strip().splitlines()[0] if r.reason else "?",
                              frame.filename if frame else "?",
                              frame.lineno if frame else 0))
    return tuple(out)


def _snapshot(obj) -> dict:
    if not isinstance(obj, torch.nn.Module):
        return {}
    return {k: v.detach().clone() for k, v in obj.state_dict(keep_vars=True).items()}


def _restore(obj, state: dict) -> None:
    if not state:
        return
    current = obj.state_dict(keep_vars=True)
    with torch.no_grad():
        for k, v in state.items():
            current[k].copy_(v)
