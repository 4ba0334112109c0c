"""Run a compiled artifact with eager semantics: autograd, input mutation, output aliasing.

Forward and backward run inside one torch.autograd.Function; input mutations are copied back
into the caller's tensors (bumping their version counters); outputs that alias inputs or each
other are regenerated as views, so they alias exactly as in eager mode.
"""
from __future__ import annotations

import math
import warnings
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from trainc import accumulate, rng
from trainc.codegen import CompiledGraph
from trainc.graph import GraphSignature, OutputKind, is_dense
from trainc.joint import UnsupportedError

# Unused outputs' zero tangents this large in all are passed expanded (see _tangents).
ZERO_TANGENT_EXPAND_BYTES = 1 << 24
# An ExpandedBackwards layout entry: that tangent is such a zero, and the backward compiled
# for it drops what only propagates it (passes/zero_tangents.py)
ZERO_TANGENT = "zero"
DOUBLE_BACKWARD_MSG = (
    "trainc: double backward (torch.autograd.grad/backward with create_graph=True) through a "
    "trainc-compiled region is not supported: its compiled backward is not differentiable, so "
    "the higher-order terms would be missing. Compute higher-order gradients (gradient "
    "penalties, Hessian-vector products) without trainc: run that model or function eagerly, "
    "or with torch.compile(..., backend=\"eager\")")


@dataclass(frozen=True)
class Artifact:
    """Everything needed to run one compiled graph for one input signature."""
    signature: GraphSignature
    fwd: CompiledGraph  # training: primals -> [mutations, computed, saved]; else no saved
    bwd: Optional[CompiledGraph]  # [saved, tangents] -> grads
    # [saved, tangents, .grad of the plan's parameters] -> grads, those added into their .grad
    bwd_acc: Optional[CompiledGraph] = None
    acc: Optional[accumulate.AccumulatePlan] = None
    # backwards compiled for tangents that arrive expanded (the gradient of out.sum(): stride
    # 0 everywhere), made on first use; None (e.g. loaded from the artifact cache): such
    # tangents are made contiguous
    expanded: Optional["ExpandedBackwards"] = None


class ExpandedBackwards:
    """The backward graph compiled again per layout of its expanded tangents (a stride-0 dim of
    size > 1), so it reads them as they are instead of getting a dense copy: `.contiguous()` of
    out.sum()'s gradient writes the whole output and, on CPU, page-faults it in. Tangents of
    outputs nobody differentiated (_tangents) are ZERO_TANGENT in the layout: their variant
    runs none of the backward ops that only carry that zero (eager skips them too).

    With `background` (triton on CUDA, Config.background_compile) a new layout compiles in a
    thread: until it is ready, calls run the traced backward on a dense copy (eager's result
    within DESIGN.md's tolerance, as always; not necessarily the same bits as the variant's):
    the compile is a large share of a first call (BENCHMARKS.md)."""

    def __init__(self, compile_with: Optional[Callable[[list], CompiledGraph]],
                 cache: Optional[tuple] = None, background: bool = False):
        # tangent strides (None: as traced) -> backward; None when the artifact came from the
        # disk cache (no graph to compile: only variants an earlier process stored are used)
        self.compile_with = compile_with
        self.cache = cache  # (artifact cache key, config)
        self.background = background
        self.graphs: dict[tuple, Any] = {}  # layout -> CompiledGraph, None or a pending Future

    def get(self, tangents: list, zeros: Sequence[bool] = ()) -> Optional[CompiledGraph]:
        zeros = list(zeros) or [False] * len(tangents)
        key = tuple(ZERO_TANGENT if z else tuple(t.stride()) if _expanded(t) else None
                    for t, z in zip(tangents, zeros))
        if not any(k is not None for k in key):
            return None
        if key not in self.graphs:
            graph = self._load(key)
            if graph is None and self.compile_with is not None:
                if self.background:
                    self.graphs[key] = _compile_in_background(self._compile, key)
                    return None
                graph = self._compile(key)
            self.graphs[key] = graph
        graph = self.graphs[key]
        if isinstance(graph, futures.Future):
            if not graph.done():
                return None
            graph = self.graphs[key] = _result(graph)
        return graph

    def _load(self, key: tuple) -> Optional[CompiledGraph]:
        from trainc import artifact_cache
        k, config = self._cache_key()
        return artifact_cache.load_variant(k, key, config)

    def _compile(self, key: tuple) -> CompiledGraph:
        from trainc import artifact_cache
        graph = self.compile_with(list(key))
        if self.background:  # its kernels too (codegen/triton _FirstRun), not at its first call
            getattr(graph.run, "prepare", lambda: None)()
        k, config = self._cache_key()
        artifact_cache.store_variant(k, key, graph, config)
        return graph

    def _cache_key(self) -> tuple:
        return self.cache if self.cache is not None else (None, None)


_background: Optional[futures.ThreadPoolExecutor] = None
_pending: list = []  # Futures of background compiles, for wait_for_background_compiles


def _compile_in_background(fn: Callable, *args) -> futures.Future:
    global _background
    if _background is None:  # one thread: compiles run one after another, as in the caller
        _background = futures.ThreadPoolExecutor(1, thread_name_prefix="trainc-compile")
    fut = _background.submit(fn, *args)
    _pending.append(fut)
    return fut


def _result(fut: futures.Future) -> Optional[CompiledGraph]:
    """A finished background compile's graph; one that failed is reported and its calls keep
    the dense copy (correct, only slower)."""
    try:
        return fut.result()
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"trainc: compiling the backward for expanded tangents failed "
                      f"({type(e).__name__}: {e}); those calls keep a dense copy of the tangent")
        return None


def wait_for_background_compiles(timeout: Optional[float] = None) -> None:
    """Wait until the compiles started in the background (ExpandedBackwards) have finished,
    so the calls after this use what they made (benchmarks measure the steady state)."""
    while _pending:
        futures.wait([_pending.pop()], timeout)


def _expanded(t: torch.Tensor) -> bool:
    return any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride()))


def run(art: Artifact, args: Sequence[Any]) -> list:
    """Call the compiled graph as the captured graph would have been called."""
    sig = art.signature
    prims = list(args) + ([rng.draw_seed()] if sig.has_rng else [])
    nm = len(sig.mutated_inputs)
    if sig.training:
        computed = _Function.apply(art, *prims)
    else:
        with torch.no_grad():
            vals = _forward_values(art, art.fwd.run(prims))
        _write_back(args, sig.mutated_inputs, vals[:nm])
        computed = vals[nm:]
    return _user_outputs(sig, args, computed)


def _write_back(args: Sequence[Any], mutated: Sequence[int], new_values: Sequence) -> None:
    """Mutated inputs take their new values: those the graph wrote in place get their version
    bumped (as copy_ would), the others are copied into."""
    if not mutated:
        return
    in_place = []
    for i, new in zip(mutated, new_values):
        a = args[i]
        if new is a or (new.data_ptr() == a.data_ptr() and new.stride() == a.stride()):
            in_place.append(a)
        else:
            with torch.no_grad():
                a.copy_(new)
    torch.autograd.graph.increment_version(in_place)


def _forward_values(art: Artifact, results: list) -> list:
    """Mutation values + computed outputs, computed outputs laid out as eager lays them out."""
    nm = len(art.signature.mutated_inputs)
    vals = list(results[:art.signature.num_fwd_outputs])
    for c, stride in enumerate(art.signature.computed_strides):
        v = vals[nm + c]
        # Eager layouts that overlap (expanded views) cannot be written into; keep ours.
        if isinstance(v, torch.Tensor) and v.stride() != stride and v.numel() > 1 \
                and is_dense(v.shape, stride):
            vals[nm + c] = torch.empty_strided(v.shape, stride, dtype=v.dtype,
                                               device=v.device).copy_(v)
    # Two outputs merged into one value (CSE of equal expressions) are two tensors in eager:
    # one object twice would alias them, and autograd would sum their tangents into one.
    seen: set[int] = set()
    for k in range(nm, len(vals)):
        v = vals[k]
        if isinstance(v, torch.Tensor):
            if id(v) in seen:
                vals[k] = v.clone()
            seen.add(id(v))
    return vals


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, art: Artifact, *prims):
        sig = art.signature
        results = art.fwd.run(list(prims))
        vals = _forward_values(art, results)
        saved = results[sig.num_fwd_outputs:]
        # A saved input that the graph mutates must keep its old value for the backward.
        mutated = {id(prims[i]) for i in sig.mutated_inputs}
        saved = [s.clone() if isinstance(s, torch.Tensor) and id(s) in mutated else s
                 for s in saved]
        ctx.art = art
        if art.acc is not None:
            ctx.acc_params = [prims[i] for i in art.acc.inputs]
        ctx.is_tensor = [isinstance(s, torch.Tensor) for s in saved]
        ctx.save_for_backward(*[s for s in saved if isinstance(s, torch.Tensor)])
        ctx.non_tensors = [s for s in saved if not isinstance(s, torch.Tensor)]
        # Mutated inputs (BatchNorm running stats) are written back here, not returned: each
        # output of an autograd Function costs its bookkeeping on every call.
        nm = len(sig.mutated_inputs)
        _write_back(prims, sig.mutated_inputs, vals[:nm])
        computed = vals[nm:]
        # Autograd would otherwise hand backward a zeros tensor for every output without a
        # gradient; backward makes zeros only for the tangents its graph reads.
        ctx.set_materialize_grads(False)
        ctx.tangent_meta = [(computed[t].shape, computed[t].dtype, computed[t].device)
                            for t in sig.tangents]
        differentiable = set(sig.tangents)
        ctx.mark_non_differentiable(*[v for k, v in enumerate(computed)
                                      if k not in differentiable and isinstance(v, torch.Tensor)])
        return tuple(computed)

    @staticmethod
    def backward(ctx, *grads):
        if torch.is_grad_enabled():  # create_graph=True: never a silent first-order answer
            raise UnsupportedError(DOUBLE_BACKWARD_MSG)
        art: Artifact = ctx.art
        sig = art.signature
        tensors, others = iter(ctx.saved_tensors), iter(ctx.non_tensors)
        saved = [next(tensors) if t else next(others) for t in ctx.is_tensor]
        # The compiled backward frees each saved value after its last use (run() takes its
        # argument list over), so nothing else may hold them: autograd's references go now
        # (kept when the graph is retained), ours are handed over in one list below.
        del tensors
        ctx.maybe_clear_saved_tensors()
        expandable = art.expanded is not None
        tangents, zeros = _tangents([grads[t] for t in sig.tangents], ctx.tangent_meta,
                                    expandable)
        into = art.acc and accumulate.targets(ctx, art.acc, ctx.acc_params, saved + tangents)
        bwd = art.expanded.get(tangents, zeros) if expandable and not into else None
        if bwd is None:
            tangents = [g.contiguous() for g in tangents]
        args = saved + tangents
        del saved, tangents, grads
        if bwd is not None:
            return (None, *_grads_by_input(sig, bwd.run(args)))
        if into:
            results = art.bwd_acc.run(args + into)
            for k, g in zip(art.acc.slots, into):
                g.copy_(results[k])  # no-op when written in place; bumps the version, as add_
                results[k] = None  # AccumulateGrad gets nothing to add
        else:
            results = art.bwd.run(args)
        return (None, *_grads_by_input(sig, results))


def _tangents(grads: list, meta: list, expandable: bool) -> tuple[list, list]:
    """The backward's tangents, with zeros for outputs nobody differentiated (a model's logits
    beside its loss, its KV caches), and which of them are such zeros. When those zeros are
    large they are one zero expanded, read by nothing in the zero-tangent backward
    (ExpandedBackwards): dense ones cost their whole size in memory and bandwidth at the start
    of every backward, and the ops they feed run on zeros. Small ones stay dense zeros through
    the traced backward: a variant costs a compile."""
    unused = sum(math.prod(shape) * dtype.itemsize
                 for g, (shape, dtype, _) in zip(grads, meta) if g is None)
    expand = expandable and unused >= ZERO_TANGENT_EXPAND_BYTES
    tangents = [g if g is not None else
                torch.zeros((), dtype=dtype, device=device).expand(shape)
                if expand and math.prod(shape) > 1 else
                torch.zeros(shape, dtype=dtype, device=device)
                for g, (shape, dtype, device) in zip(grads, meta)]
    return tangents, [expand and g is None for g in grads]


def _grads_by_input(sig: GraphSignature, results: list) -> list:
    out: list = [None] * len(sig.inputs)
    for i, g in zip(sig.grads, results):
        out[i] = g
    return out


def _user_outputs(sig: GraphSignature, args: Sequence, computed: Sequence) -> list:
    outs = []
    for o in sig.outputs:
        if o.kind is OutputKind.COMPUTED:
            outs.append(computed[o.base])
            continue
        base = args[o.base] if o.kind is OutputKind.ALIAS_OF_INPUT else computed[o.base]
        outs.append(base.as_strided(o.size, o.stride, base.storage_offset() + o.storage_offset))
    return outs
