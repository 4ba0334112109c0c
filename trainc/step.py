"""trainc.compile_step: forward, loss, backward and optimizer update traced as one graph.

Graph inputs: parameters, buffers, accumulated grads, optimizer state, hyperparameters (0-d
tensors), batch, seed. Parameters, buffers and state are updated in place with eager semantics;
optimizer state stays in `optimizer.state`, so state_dict / load_state_dict keep working.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

from trainc import (artifact_cache, attention, chunked_loss, debug, decisions, distributed,
                    offloading, records, rng)
from trainc.codegen import (CompiledGraph, compile_workers, memory_models, memory_planner,
                            prestart_for, target_for)
from trainc.config import Config, make_config, resolve
from trainc.graph import GraphSignature, InputInfo, InputKind, JointGraph
from trainc.joint import finish_graph, trace_functional
from trainc.optim import (HOOK_MODES, Rule, hyper_values, rule_for, run_post_hooks,
                          run_pre_hooks)
from trainc.codegen.memory.offload import OFFLOAD, OffloadRequest
from trainc.partition import with_moved
from trainc.partition.whole_step import recompute_in_step
from trainc.pipeline import (_example_inputs, backend_for, generate, joint_passes, no_cyclic_gc,
                             post_grad)


@dataclass(frozen=True)
class _Layout:
    """Where each kind of input sits in the flat input list of one compiled step."""
    params: tuple[int, ...]  # model parameter indices (into _Step.params) that get grads
    acc: tuple[bool, ...]  # per used param: an accumulated .grad is an input
    fresh: tuple[bool, ...]  # per used param: its optimizer state was just created
    state_keys: tuple[tuple[str, ...], ...]  # per used param
    n_batch: int
    sync: Optional[distributed.GradSync] = None  # DDP: the gradients' all-reduce in the step


@dataclass(frozen=True)
class _Compiled:
    layout: _Layout
    graph: CompiledGraph
    signature: GraphSignature
    accumulate: bool
    tangent: Optional[torch.Tensor] = None  # memory budget: the backward's seed gradient (1.0)


class _LossModule(torch.nn.Module):
    """Lets functional_call swap the model's parameters for the whole loss_fn call."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, *batch):
        return self.loss_fn(self.model, *batch)


class CompiledStep:
    """`step(*batch) -> loss`: one optimizer step; `step(*batch, accumulate=True)` only adds
    grads."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer,
                 clip_grad_norm: Optional[float], config: Config, optimizer_hooks: str = "error"):
        if optimizer_hooks not in HOOK_MODES:
            raise ValueError(f"trainc.compile_step: optimizer_hooks must be one of {HOOK_MODES}, "
                             f"got {optimizer_hooks!r}")
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.hooks = optimizer_hooks
        self.rule: Rule = rule_for(optimizer)
        self.clip, self.config = clip_grad_norm, config
        self.ddp = distributed.ddp_of(model)
        self.wrapper = _LossModule(model, loss_fn)
        self.cache: dict[tuple, _Compiled] = {}
        self.compiles = 0  # graphs compiled so far (a new lr or batch of the same shape: none)
        self._check_params()

    def _check_params(self) -> None:
        in_opt = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        self.params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        missing = [n for n, p in self.params if id(p) not in in_opt]
        if missing:
            raise ValueError(f"trainc.compile_step: parameters {missing[:5]} require grad but are "
                             "not in the optimizer; add them or call requires_grad_(False)")
        self.group_of = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
        self.buffers = list(self.model.named_buffers())

    def __call__(self, *batch: Any, accumulate: bool = False) -> torch.Tensor:
        # Eager accumulation runs no optimizer.step(), so no hooks; pre-hooks run before the
        # key is built, as they may change hyperparameters (or flags) of this step.
        post = [] if accumulate else run_pre_hooks(self.optimizer, self.hooks)
        distributed.sync_buffers_before(self.ddp)
        loss = self._step(batch, accumulate)
        run_post_hooks(self.optimizer, post)
        return loss

    @property
    def kept_bytes(self) -> int:
        """Bytes of buffers the compiled graphs keep allocated between calls (backend "cpp"
        without a memory budget): resident memory a per-call peak measurement does not see."""
        graphs = {id(c.graph): c.graph for c in self.cache.values()}
        return sum(g.extra.get("kept_bytes", 0) for g in graphs.values())

    def _step(self, batch, accumulate: bool) -> torch.Tensor:
        key = self._key(batch, accumulate)
        comp = self.cache.get(key)
        if comp is None:
            comp = self.cache[key] = self._compile(batch, accumulate)
            self.compiles += 1
            if not self.rule.fresh_matters:  # state just created: same graph from now on
                self.cache[self._key(batch, accumulate)] = comp
        return self._run(comp, batch)

    # -- keys and inputs -------------------------------------------------------------------
    def _key(self, batch, accumulate: bool) -> tuple:
        ps = tuple((_tkey(p), p.grad is not None, tuple(sorted(self.optimizer.state.get(p, {}))))
                   for _, p in self.params)
        groups = tuple(self.rule.flags(g) for g in self.optimizer.param_groups)
        autocast = tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                         for d in ("cpu", "cuda"))
        sync = self.ddp is not None and self.ddp.require_backward_grad_sync
        return (accumulate, ps, groups, tuple(_tkey(b) for _, b in self.buffers),
                tuple(_tkey(x) for x in batch), self.model.training, autocast, self.clip, sync)

    def _flat_inputs(self, layout: _Layout, batch) -> list:
        used = [self.params[i][1] for i in layout.params]
        acc = [p.grad for p, a in zip(used, layout.acc) if a]
        states = [self.optimizer.state[p][k] for p, keys in zip(used, layout.state_keys)
                  for k in keys]
        hyper = [torch.tensor(v, dtype=torch.float64) for g in self.optimizer.param_groups
                 for v in hyper_values(self.rule, g)]
        return ([p for _, p in self.params] + [b for _, b in self.buffers] + acc + states + hyper
                + list(batch))

    # -- compile ---------------------------------------------------------------------------
    def _compile(self, batch, accumulate: bool) -> _Compiled:
        t0, gid = time.perf_counter(), debug.next_graph_id()
        used = self._used_params(batch)
        fresh = []
        for i in used:
            p = self.params[i][1]
            empty = not self.optimizer.state.get(p)
            fresh.append(empty and self.rule.fresh_matters)
            init = self.rule.init(self.group_of[id(p)], p) if empty and not accumulate else {}
            if init:
                self.optimizer.state[p].update(init)
        keys = tuple(tuple(self.rule.state(self.group_of[id(self.params[i][1])]))
                     if not accumulate else () for i in used)
        sync = distributed.grad_sync(self.ddp, [self.params[i][0] for i in used])
        layout = _Layout(tuple(used), tuple(self.params[i][1].grad is not None for i in used),
                         tuple(fresh), keys, len(batch), sync)
        flat = self._flat_inputs(layout, batch)
        # about 4 graph nodes per parameter (one layer's ops): the worker count's scale
        with compile_workers(self.config.backend, _device(flat), self.config, 4 * len(used)), \
                no_cyclic_gc():
            return self._compile_graph(layout, flat, accumulate, t0, gid)

    def _compile_graph(self, layout: "_Layout", flat: list, accumulate: bool, t0: float,
                       gid: int) -> _Compiled:
        # Recompute inside the step: under a memory budget, or by default the min-cut's plan
        # without one (as trainc.compile's partition; partitioner="save_all" keeps every value)
        recompute = self.config.memory_budget is not None or self.config.partitioner == "mincut"
        gm, mutated, has_rng = self._trace(layout, flat, accumulate, recompute)
        sig = self._signature(layout, flat, mutated, has_rng, gm, recompute)
        tangent = torch.ones((), device=_device(flat)) if recompute else None
        key, cached, status = artifact_cache.lookup_graph(
            gm, flat, sig, ("step", accumulate, recompute), self._graph_config(flat))
        if cached is not None:  # compiled by an earlier process: no passes, partition, codegen
            rec = dataclasses.replace(cached[1], graph_id=gid, cache="hit",
                                      compile_seconds=time.perf_counter() - t0)
            records.publish(decisions.check_ranks(rec, self.config, self._group()), self.config)
            return _Compiled(layout, cached[0], sig, accumulate, tangent)
        dump = debug.Dumper(self.config, gid)
        gm = joint_passes(gm, dump, "00_step.py", "whole training step after functionalization",
                          self.config)
        config, backend = backend_for(self.config, _device(flat), step=True)
        part = None
        if recompute:  # after CSE, which would merge the recomputed copies back
            gm, part = recompute_in_step(gm, config, _step_predictor(backend, sig, config,
                                                                       _device(flat)))
            dump.text("20_partition.txt", records.decision_table(part.decisions))
        # Parameters, buffers and optimizer state may be written in place (no second copy).
        gm = post_grad(gm, sig, config, check=False)
        moves = part is not None and bool(part.offloaded) and backend.target.offloads
        if moves:  # policy-tagged or budget-chosen values: out to host and back in the step
            gm.meta[OFFLOAD] = OffloadRequest(inner=True, names=part.offloaded,
                                              bandwidth=offloading.host_bandwidth(_device(flat)))
        compiled = generate(backend, gm, [i.name for i in sig.inputs if i.kind in _STAYS_PUT])
        if part is not None and part.offloaded:
            part = with_moved(part, compiled.extra.get("offloaded_nodes", ()),
                              offloading.kept_why(backend.name, moves))
        dump.compiled("30", "step", gm, compiled, "whole step graph given to the backend")
        dump.codegen(step=compiled)
        rec = records.GraphRecord.make(gid, JointGraph(gm, sig, self._attention_rewrites,
                                                  self._chunked_losses), part,
                                       gm, None, compiled, None, backend.name,
                                       time.perf_counter() - t0)
        rec = dataclasses.replace(rec, mode="step", decision_record=decisions.make(
            config, [(i.kind, x) for i, x in zip(sig.inputs, flat)], part, {"step": compiled},
            rec.passes))
        stored = artifact_cache.store_graph(key, compiled, rec, config)
        rec = dataclasses.replace(rec, cache=f"{status}; {stored}" if key else status)
        records.publish(decisions.check_ranks(rec, self.config, self._group()), self.config)
        return _Compiled(layout, compiled, sig, accumulate, tangent)

    def _group(self):
        """Where the ranks' decisions are compared: the DDP wrapper's process group."""
        return self.ddp.process_group if self.ddp is not None else None

    def _graph_config(self, flat: list) -> Config:
        """The config with its defaults decided for this step's device and backend
        (config.resolve: CUDA graphs "auto" on CUDA where the backend replays by default)."""
        device = _device(flat)
        return resolve(self.config, target_for(self.config.backend, device), device.type,
                       step=True)

    def _used_params(self, batch) -> list[int]:
        """Indices of parameters that receive a gradient (eager skips the others entirely)."""
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode, torch.enable_grad(), distributed.traced_forward(self.ddp):
            leaves = {n: mode.from_tensor(p).detach().requires_grad_(True) for n, p in self.params}
            bufs = {n: mode.from_tensor(b) for n, b in self.buffers}
            fake_batch = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in batch]
            loss = self._loss(leaves, bufs, fake_batch)
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        return [i for i, g in enumerate(grads) if g is not None]

    def _loss(self, leaves: dict, bufs: dict, batch) -> torch.Tensor:
        state = {f"model.{n}": t for n, t in {**leaves, **bufs}.items()}
        loss = torch.func.functional_call(self.wrapper, state, tuple(batch), tie_weights=True)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError("trainc.compile_step: loss_fn(model, *batch) must return a scalar "
                             f"tensor, got {type(loss).__name__}")
        return loss

    def _trace(self, layout: _Layout, flat: list, accumulate: bool, tangent: bool):
        """With `tangent`, the backward starts from a `tangents_0` input (1.0) instead of an
        implicit ones: what depends on it is the backward region the budget partitions."""
        fn = self._step_fn(layout, accumulate, tangent)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        # Inputs enter as plain (non-grad) tensors: the graph writes parameters in place.
        fakes = [mode.from_tensor(x.detach()) if isinstance(x, torch.Tensor) else x for x in flat]
        with mode, distributed.traced_forward(self.ddp):
            extra = [torch.empty((), device=_device(flat))] if tangent else []
            extra.append(torch.empty((), dtype=torch.int64))
            gm = trace_functional(fn, *fakes, *extra)
        has_rng, mutated = finish_graph(gm, len(flat) + tangent, 0)
        if tangent:
            ph = [n for n in gm.graph.nodes if n.op == "placeholder"][len(flat)]
            ph.name = ph.target = "tangents_0"
            gm.recompile()
        return gm, mutated, has_rng

    def _step_fn(self, layout: _Layout, accumulate: bool, tangent: bool) -> Callable:
        n_p, n_b = len(self.params), len(self.buffers)
        n_acc = sum(layout.acc)
        n_state = sum(len(k) for k in layout.state_keys)
        n_hyper = len(self.rule.hyper) * len(self.optimizer.param_groups)

        def whole(*flat):
            params, rest = flat[:n_p], flat[n_p:]
            bufs, rest = rest[:n_b], rest[n_b:]
            acc, rest = list(rest[:n_acc]), rest[n_acc:]
            states, rest = list(rest[:n_state]), rest[n_state:]
            hyper, rest = rest[:n_hyper], rest[n_hyper:]
            batch, rest = rest[:layout.n_batch], rest[layout.n_batch:]
            seed = rest[-1]
            with rng.tracing(seed), torch.enable_grad():
                leaves = [p.detach().requires_grad_(True) for p in params]
                with attention.tracing(self.config.fuse_attention) as att, \
                        chunked_loss.tracing(bool(self.config.chunk_loss)) as chunks:
                    loss = self._loss({n: l for (n, _), l in zip(self.params, leaves)},
                                      {n: b.detach() for (n, _), b in zip(self.buffers, bufs)},
                                      batch)
                self._attention_rewrites = att.rewrites if att is not None else 0
                self._chunked_losses = chunks.rewrites if chunks is not None else 0
                used = [leaves[i] for i in layout.params]
                seed_grad = rest[0].to(loss.dtype).expand(loss.shape) if tangent else None
                grads = list(torch.autograd.grad(loss, used, seed_grad))
            with torch.no_grad():
                grads = [g + acc.pop(0) if a else g for g, a in zip(grads, layout.acc)]
                if layout.sync is not None:  # eager DDP's .grad: averaged over the group
                    grads = distributed.average_grads(grads, layout.sync)
                if accumulate:
                    return [loss.detach(), *grads]
                if self.clip is not None:
                    grads = _clip(grads, self.clip)
                self._update(layout, used, grads, states, hyper)
            return [loss.detach()]

        return whole

    def _update(self, layout: _Layout, used, grads, states, hyper) -> None:
        by_param = []
        for keys in layout.state_keys:
            by_param.append({k: states.pop(0) for k in keys})
        h_per_group = len(self.rule.hyper)
        for gi, group in enumerate(self.optimizer.param_groups):
            h = dict(zip(self.rule.hyper, hyper[gi * h_per_group:(gi + 1) * h_per_group]))
            ids = {id(p) for p in group["params"]}
            sel = [j for j, i in enumerate(layout.params) if id(self.params[i][1]) in ids]
            self.rule.update([used[j] for j in sel], [grads[j] for j in sel],
                             [by_param[j] for j in sel], h, self.rule.flags(group),
                             [layout.fresh[j] for j in sel])

    def _signature(self, layout, flat, mutated, has_rng, gm, tangent: bool) -> GraphSignature:
        n_p, n_b = len(self.params), len(self.buffers)
        n_fixed = n_p + n_b + sum(layout.acc)
        n_state = sum(len(k) for k in layout.state_keys)
        kinds = ([InputKind.PARAM] * n_p + [InputKind.BUFFER] * n_b
                 + [InputKind.USER] * sum(layout.acc) + [InputKind.STATE] * n_state)
        kinds += [InputKind.SCALAR] * (len(flat) - n_fixed - n_state - layout.n_batch)
        kinds += [InputKind.USER] * layout.n_batch
        inputs = tuple(InputInfo(f"primals_{i}", k, False, i in mutated)
                       for i, k in enumerate(kinds))
        if tangent:
            inputs += (InputInfo("tangents_0", InputKind.USER, False),)
        if has_rng:
            inputs += (InputInfo("seed", InputKind.SEED, False),)
        n_out = len(gm.graph.output_node().args[0]) - len(mutated)
        return GraphSignature(inputs, (), n_out, ((),) * n_out, (), (), False)

    # -- run -------------------------------------------------------------------------------
    def _run(self, comp: _Compiled, batch) -> torch.Tensor:
        flat = self._flat_inputs(comp.layout, batch)
        sig = comp.signature
        with torch.no_grad():
            extra = [comp.tangent] if comp.tangent is not None else []
            results = comp.graph.run(flat + extra + ([rng.draw_seed()] if sig.has_rng else []))
            mutated = sig.mutated_inputs
            for i, new in zip(mutated, results):
                if new is not flat[i]:
                    flat[i].copy_(new)
        loss, grads = results[len(mutated)], results[len(mutated) + 1:]
        used = [self.params[i][1] for i in comp.layout.params]
        if comp.accumulate:
            for p, g in zip(used, grads):
                p.grad = g
        else:
            counters = [self.optimizer.state[p][k] for p, keys in
                        zip(used, comp.layout.state_keys) for k in keys
                        if k in self.rule.host_counters]
            if counters:  # one op for all of them (AdamW on mlp: 48 step counts)
                torch._foreach_add_(counters, 1)
            for _, p in self.params:
                p.grad = None
            # LR schedulers check this flag to warn about calling them before optimizer.step().
            self.optimizer._opt_called = True  # type: ignore[attr-defined]
        return loss


_STAYS_PUT = (InputKind.PARAM, InputKind.BUFFER, InputKind.STATE)


def _clip(grads: list, max_norm: float) -> list:
    """torch.nn.utils.clip_grad_norm_ with the 2-norm, functionally."""
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return [g * coef.to(g.dtype) for g in grads]


def _tkey(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad)


def _device(flat: list) -> torch.device:
    for t in flat:
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            return t.device
    return torch.device("cpu")


def compile_step(model: torch.nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer, *,
                 clip_grad_norm: Optional[float] = None, backend: str = "auto",
                 memory_budget: Any = None, optimizer_hooks: str = "error",
                 **options: Any) -> CompiledStep:
    """The whole training step as one graph: `step = compile_step(...); loss = step(*batch)`.

    Equivalent eager step: `loss = loss_fn(model, *batch); loss.backward();
    [clip_grad_norm_]; optimizer.step(); optimizer.zero_grad(set_to_none=True)`.
    `step(*batch, accumulate=True)` only adds this batch's gradients into `.grad` (micro-batch
    accumulation); the next plain `step(...)` adds its own and applies the update.
    `memory_budget` (as in trainc.compile: a cap on the simulated peak; 0.0 = least memory)
    makes the backward recompute forward values the min-cut partitioner chooses, inside the one
    graph; None recomputes what the min-cut partitioner's default plan picks (the fewest saved
    bytes without recomputing expensive ops, as trainc.compile), and `partitioner="save_all"`
    keeps every forward value the backward reads.
    Optimizer step hooks (`register_step_pre_hook` / `_post_hook`, and the global ones) cannot
    run where eager runs them (between backward and update, with .grad set): by default a
    registered hook is an error at the next step; `optimizer_hooks="run"` calls pre-hooks
    before and post-hooks after the whole compiled step, with .grad None.
    A DistributedDataParallel model's gradients are averaged over its process group inside the
    step (bucketed functional all-reduces, ATen fallbacks), as eager DDP's reducer does; inside
    `model.no_sync()` they stay local. DDP options it cannot reproduce and FSDP-sharded models
    raise UnsupportedError (trainc/distributed.py).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"trainc.compile_step expects an nn.Module, got {type(model).__name__}")
    config = make_config(backend, memory_budget, **options)
    if config.regions:  # the step is one make_fx trace: there is no layer call to split at
        raise ValueError("trainc.compile_step: regions='auto' is a trainc.compile option (the "
                         "step is traced as one graph)")
    prestart_for(model, config)  # Triton compile workers, for a CUDA module
    return CompiledStep(model, loss_fn, optimizer, clip_grad_norm, config, optimizer_hooks)


def _step_predictor(backend, sig, config: Config, device: torch.device):
    """Under a memory budget, a stitched step graph -> the peak its wrapper's memory plan
    predicts after the post-grad passes (codegen/driver.py memory_plan_only); None without a
    budget or where the backend makes no plan (aten: the partitioner's simulation decides)."""
    planner = memory_planner(backend)
    if planner is None or config.memory_budget is None:
        return None
    if config.offload and backend.target.offloads:  # saved values may move within the step
        models = memory_models(backend)
        return offloading.StepOffload(
            lambda stitched: post_grad(stitched, sig, config, check=False),
            lambda g: models(g, _example_inputs(g)),
            offloading.host_bandwidth(device))

    def predict(stitched: fx.GraphModule) -> int:
        g = post_grad(stitched, sig, config, check=False)
        return planner(g, _example_inputs(g)).peak_bytes
    return predict
