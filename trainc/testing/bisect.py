"""bisect: a case whose compiled results fail the float64 policy -> the first stage that fails.

Stages in pipeline order (trace, each joint pass, partition, each post-grad pass, backend, each
generated kernel); prefix i of that list on, the rest at its reference (pass off, save_all,
backend "aten", kernel as ATen calls): the first failing prefix names the stage.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx as fx

from trainc.testing.check import Inputs, _clone, assert_grads_match
from trainc.testing import repro as _repro

# capture, joint tracing, functionalization, decompositions: no switch; every other stage off
TRACE = "(every pass off, save_all, aten)"


@dataclasses.dataclass(frozen=True)
class Stage:
    kind: str  # "trace" | "joint pass" | "partition" | "post-grad pass" | "backend" | "kernel"
    name: str
    options: dict  # compile options with this stage and every stage before it on

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


@dataclasses.dataclass(frozen=True)
class Step:
    stage: Stage
    failure: Optional[str]  # None: passed the policy

    def __str__(self) -> str:
        return f"  {str(self.stage):<44} {'ok' if self.failure is None else 'FAILS'}"


@dataclasses.dataclass(frozen=True)
class BisectResult:
    """The first failing stage (None: the case passes as compiled), the steps that found it,
    the last passing stage before it, and the repro script written."""
    stage: Optional[Stage]
    steps: tuple[Step, ...]
    passing: Optional[Stage] = None
    failure: str = ""
    repro: Optional[str] = None
    note: str = ""

    def __str__(self) -> str:
        lines = ["trainc.testing.bisect:", *map(str, self.steps)]
        if self.stage is None:
            return "\n".join(lines + [self.note or "  the case passes the policy as compiled"])
        lines.append(f"first failing stage: {self.stage}")
        if self.note:
            lines.append(self.note)
        if self.repro:
            lines.append(f"repro: python {self.repro}")
        return "\n".join(lines + [self.failure.splitlines()[1] if "\n" in self.failure
                                  else self.failure])


def bisect(fn_or_module: Callable, inputs: Inputs, *, repro_path: Optional[str] = "trainc_repro.py",
           seed: int = 0, verbose: bool = True, **compile_options: Any) -> BisectResult:
    """Find the stage that makes `fn_or_module(*inputs)` fail trainc.testing's policy under
    `compile_options` (as trainc.compile takes them); print it and write a standalone repro of
    the failing captured graph to `repro_path` (None: none). The artifact cache is off."""
    if not callable(fn_or_module):
        raise TypeError(f"trainc.testing.bisect expects an nn.Module or a function, got "
                        f"{type(fn_or_module).__name__}")
    make = inputs if callable(inputs) else (lambda: [_clone(x) for x in inputs])
    options = {**compile_options, "cache_artifacts": False}
    subject, subject_inputs, graph_note = _failing_graph(fn_or_module, make, options, seed)
    first = _check(subject, subject_inputs, options, seed)
    if first is None and subject is not fn_or_module:  # fails only as a whole
        subject, subject_inputs = fn_or_module, make
        graph_note = "  the captured graph passes alone: bisecting the whole case"
        first = _check(subject, subject_inputs, options, seed)
    if first is None:
        result = BisectResult(None, (), note="  the case passes the policy as compiled: "
                                             "nothing to bisect")
        return _done(result, verbose)
    steps: list[Step] = []
    stages = pipeline_stages(options, _device(subject_inputs()))
    culprit, passing = _first_failing(subject, subject_inputs, stages, seed, steps, first)
    note = graph_note
    if culprit.kind == "backend":
        culprit, passing, why = _kernel_bisect(subject, subject_inputs, culprit, passing, seed,
                                               steps)
        note = "\n".join(x for x in (note, why) if x)
    failure = next(s.failure for s in steps if s.stage is culprit) if \
        any(s.stage is culprit for s in steps) else first
    path = None
    if repro_path is not None and isinstance(subject, fx.GraphModule):
        path = _repro.write(repro_path, subject, subject_inputs(), culprit, passing, seed)
    return _done(BisectResult(culprit, tuple(steps), passing, failure, path, note), verbose)


def _done(result: BisectResult, verbose: bool) -> BisectResult:
    if verbose:
        print(result, flush=True)
    return result


def pipeline_stages(options: dict, device: torch.device) -> list[Stage]:
    """The cumulative stage list: stage i's options turn on stages 0..i of `options`' pipeline
    and leave the rest at their reference."""
    from trainc.codegen import backend_name
    from trainc.passes import JOINT_PASSES, POST_GRAD_PASSES
    joint = list(dict.fromkeys(p.__name__ for p in JOINT_PASSES))
    post = list(dict.fromkeys(p.__name__ for p in POST_GRAD_PASSES))
    user_skip = tuple(options.get("skip_passes", ()))
    skip = [f"joint:{p}" for p in joint] + [f"post_grad:{p}" for p in post]
    now = {**options, "backend": "aten", "partitioner": "save_all", "memory_budget": None,
           "partition_objective": None}
    now.pop("policy", None)
    stages = [Stage("trace", TRACE, {**now, "skip_passes": tuple(skip)})]

    def turn_on(kind: str, name: str, **changes) -> None:
        now.update(changes)
        stages.append(Stage(kind, name, {**now, "skip_passes": tuple(skip)}))

    for p in joint:
        if f"joint:{p}" not in user_skip:
            skip.remove(f"joint:{p}")
            turn_on("joint pass", p)
    part = {k: options[k] for k in ("partitioner", "memory_budget", "partition_objective",
                                    "policy") if k in options}
    turn_on("partition", part.get("partitioner", "mincut") + (
        f" (memory_budget={part['memory_budget']})" if part.get("memory_budget") is not None
        else ""), **{"partitioner": "mincut", **part})
    for p in post:
        if f"post_grad:{p}" not in user_skip:
            skip.remove(f"post_grad:{p}")
            turn_on("post-grad pass", p)
    backend = backend_name(options.get("backend", "auto"), device)
    if backend != "aten":
        turn_on("backend", backend, backend=options.get("backend", "auto"))
    return stages


def _first_failing(fn, make, stages: list[Stage], seed: int, steps: list[Step],
                   last_failure: str) -> tuple[Stage, Optional[Stage]]:
    """The first stage whose options fail (the last one is known to)."""
    passing = None
    for i, stage in enumerate(stages):
        failure = last_failure if i == len(stages) - 1 else _check(fn, make, stage.options, seed)
        steps.append(Step(stage, failure))
        if failure is not None:
            return stage, passing
        passing = stage
    return stages[-1], passing  # (the options the case failed with always end the list)


def _kernel_bisect(fn, make, backend: Stage, passing: Optional[Stage], seed: int,
                   steps: list[Step]) -> tuple[Stage, Optional[Stage], str]:
    """The backend fails: first with every node's kernel code replaced by ATen calls, then
    with generated code for ever smaller halves of the nodes (the rest ATen), down to the
    node whose generated kernel fails alone (or the smallest set that fails together)."""
    universe = _generated_nodes(fn, make, backend.options)
    if not universe:
        return backend, passing, "  the backend generated no kernels: its wrapper or externs"

    def only(nodes: list[str]) -> dict:
        keep = set(nodes)
        return {**backend.options, "aten_nodes": tuple(n for n in universe if n not in keep)}
    no_kernels = Stage("backend", f"{backend.name}, every kernel as ATen calls", only([]))
    failure = _check(fn, make, no_kernels.options, seed)
    steps.append(Step(no_kernels, failure))
    if failure is not None:
        return no_kernels, passing, ("  fails with every kernel's nodes run by ATen: the "
                                     "backend's wrapper, memory plan, layouts or externs")
    culprit, nodes = backend, list(universe)
    while len(nodes) > 1:
        halves = nodes[:len(nodes) // 2], nodes[len(nodes) // 2:]
        for half in halves:
            kernels: list = []
            stage = Stage("kernel", "", only(half))
            failure = _check(fn, make, stage.options, seed, kernels)
            stage = dataclasses.replace(stage, name=_kernel_name(half, kernels))
            steps.append(Step(stage, failure))
            if failure is not None:
                culprit, nodes = stage, half
                break
        else:
            break  # neither half fails alone: the fault needs nodes of both (a fusion)
    why = "" if len(nodes) == 1 else (f"  no smaller set of generated nodes fails alone: "
                                      f"{len(nodes)} nodes fail together")
    return culprit, no_kernels, why


def _kernel_name(nodes: list[str], kernels: list) -> str:
    """The generated kernels of a compile that generates only `nodes`' code."""
    names = ", ".join(f"{k.name} ({', '.join(k.nodes)})" for k in kernels)
    shown = ", ".join(nodes[:6]) + (f" and {len(nodes) - 6} more" if len(nodes) > 6 else "")
    return f"generated code for {shown}: {names or 'no kernel'}"


def _generated_nodes(fn, make, options: dict) -> list[str]:
    """Names of the ops the backend could generate code for in the case's compiled graphs
    (views and externs excluded), in graph order: one compile through a recording backend."""
    from trainc import codegen
    name = codegen.backend_name(options.get("backend", "auto"), _device(make()))
    real, seen = codegen.BACKENDS[name], {}

    class Recording:
        def __init__(self, config):
            self.inner = real(config)
            self.name = self.inner.name

        def __getattr__(self, attr):
            return getattr(self.inner, attr)

        def compile(self, gm: fx.GraphModule, example_inputs):
            seen.update(dict.fromkeys(
                n.name for n in gm.graph.nodes if n.op == "call_function" and
                isinstance(n.target, torch._ops.OpOverload) and not n.target.is_view and
                not codegen.is_extern(n.target)))
            return self.inner.compile(gm, example_inputs)
    codegen.BACKENDS[name] = Recording
    try:
        _check(fn, make, options, 0)
    finally:
        codegen.BACKENDS[name] = real
    return list(seen)


def _check(fn, make, options: dict, seed: int, kernels: Optional[list] = None) -> Optional[str]:
    """None when the case passes the policy under `options`, else why not; the kernels the
    compile generated go into `kernels`."""
    from trainc import records
    try:
        with records.recording() as recs:
            assert_grads_match(fn, make, seed=seed, **options)
    except AssertionError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a stage that crashes fails too
        return f"raised {type(e).__name__}: {e}"
    finally:
        if kernels is not None:
            kernels += [k for r in recs for k in r.kernels]
    return None


def _failing_graph(fn, make, options: dict, seed: int):
    """The first Dynamo graph of the case that fails alone (a smaller subject and repro), or
    the whole case where none does."""
    graphs = _capture(fn, make)
    if len(graphs) == 1 and not isinstance(fn, fx.GraphModule):
        gm, args = graphs[0]
        return gm, _maker(args), ""
    for gm, args in graphs:
        if _check(gm, _maker(args), options, seed) is not None:
            return gm, _maker(args), f"  graph {graphs.index((gm, args))} of {len(graphs)} fails"
    return fn, make, f"  no single graph of {len(graphs)} fails alone: bisecting the whole case"


def _capture(fn, make) -> list[tuple[fx.GraphModule, list]]:
    """Dynamo's graphs of one call, each with (copies of) the inputs it was called with."""
    graphs: list = []

    def backend(gm: fx.GraphModule, example_inputs: Sequence):
        graphs.append((gm, [_clone(x) for x in example_inputs]))
        return gm.forward
    torch._dynamo.reset()
    call = copy.deepcopy(fn) if isinstance(fn, torch.nn.Module) else fn
    torch.compile(call, backend=backend, dynamic=False)(*make())
    torch._dynamo.reset()
    return graphs


def _maker(args: list) -> Callable[[], list]:
    return lambda: [_clone(x) for x in args]


def _device(args: Sequence) -> torch.device:
    return next((a.device for a in args if torch.is_tensor(a) and a.device.type != "cpu"),
                torch.device("cpu"))
