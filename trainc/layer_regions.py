"""Regional compilation (Config.regions): a model's repeated layers -> one trainc graph they share.

A container (nn.ModuleList / nn.Sequential) with >= MIN_REPEATS children of one class and equal
parameter and buffer shapes is a repeated region: each child's forward becomes a call into one
torch.compile'd function for the whole group. Parameters are graph inputs there, so Dynamo's
guards pass for every instance and Dynamo captures, and trainc compiles, one layer graph. The
module that runs the container (its parent for a ModuleList, the Sequential itself) runs its own
forward eagerly (the loop); its other children each compile as a graph of their own, and the model
around it compiles as usual, with a graph break at that module's call.

Ops written in the owner's forward outside its children (transformers' mask helpers) run as
eager ATen calls. Installed in place on the model's modules (instance `forward` attributes),
active only inside a call of the callable trainc.compile returned (elsewhere the modules run
eagerly); each trainc.compile installs regions of its own, keyed by a token that its callable
activates. A group whose instances do not share the graph (a guard on per-instance state, such
as a KV cache's layer index) warns with the failing guard, and `trainc.explain` lists it.
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import itertools
import types
import warnings
from typing import Any, Callable, Optional

import torch

from trainc import records

MIN_REPEATS = 2
_ACTIVE: contextvars.ContextVar[Optional[int]] = contextvars.ContextVar("trainc_regions",
                                                                        default=None)
_REGIONS: dict[tuple[int, str], "Region"] = {}  # (install token, region key) -> Region
_TOKENS = itertools.count(1)
_KEY = "_trainc_region"  # instance attribute: the module's region key


@dataclasses.dataclass
class Region:
    """One compiled function and the modules that call it (shared: a repeated group)."""
    name: str  # e.g. "model.layers[0..15] (LlamaDecoderLayer)"
    instances: tuple[str, ...]
    shared: bool
    compiled: Callable = None
    dynamo_graphs: int = 0  # graphs Dynamo captured for this region
    graph_ids: list = dataclasses.field(default_factory=list)  # trainc graphs compiled for it
    calls: int = 0
    not_reused: list = dataclasses.field(default_factory=list)  # (instance, guard) pairs
    _seen: dict = dataclasses.field(default_factory=dict)  # input signature -> first instance
    _current: str = ""

    def __str__(self) -> str:
        text = (f"region {self.name}: {len(self.instances)} instance(s), {self.calls} call(s), "
                f"{self.dynamo_graphs} Dynamo graph(s), trainc graphs "
                f"{', '.join(f'graph_{g}' for g in self.graph_ids) or 'none'}")
        for inst, guard in self.not_reused:
            text += f"\n  not reused by {inst}: guard failed: {guard}"
        return text


def find(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, list[list[str]]]]:
    """The containers to split: (path, owner module, groups of repeated children's names);
    outermost first, none inside another's layers."""
    found, taken = [], []
    for path, mod in model.named_modules():
        if not isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        if any(path.startswith(t + ".") for t in taken):
            continue
        groups: dict[tuple, list[str]] = {}
        for name, child in mod.named_children():
            groups.setdefault(_signature(child), []).append(name)
        repeated = [g for g in groups.values() if len(g) >= MIN_REPEATS]
        if repeated:
            owner = mod if isinstance(mod, torch.nn.Sequential) else _parent(model, path)
            found.append((path, owner, repeated))
            taken.append(path)
    return found


def install(model: torch.nn.Module, backend: Callable[..., Callable]) -> Optional[int]:
    """Route the repeated layers (and the other children of the modules running them) through
    regions compiled with `backend(region)`, a Dynamo backend factory; returns the token that
    `activate` takes, or None when the model has no repeated layers."""
    found = find(model)
    if not found:
        return None
    token = next(_TOKENS)
    mods = dict(model.named_modules())
    # a module holding another group's layers (an encoder beside a decoder) runs its own loop
    # eagerly: it is never one region of its own
    holders = {p for path, _, _ in found for p in mods if path == p or path.startswith(p + ".")}
    for path, owner, groups in found:
        container = mods[path]
        repeated = {n for g in groups for n in g}
        for group in groups:
            names = [_join(path, n) for n in group]
            cls = type(mods[names[0]]).__name__
            _new_region(token, f"{path}[{group[0]}..{group[-1]}] ({cls})", names, True, mods,
                        backend)
        solo = [_join(path, n) for n, _ in container.named_children() if n not in repeated]
        if owner is not container:
            owner_path = _owner_path(mods, owner)
            solo += [_join(owner_path, n) for n, c in owner.named_children() if c is not container]
        for name in solo:
            if name not in holders:
                _new_region(token, name, [name], False, mods, backend)
        owner.forward = types.MethodType(_owner_forward, owner)
    return token


def activate(fn: Callable, token: int) -> Callable:
    """`fn` (Dynamo's compiled forward) with the regions of `token` active during its calls."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        reset = _ACTIVE.set(token)
        try:
            return fn(*args, **kwargs)
        finally:
            _ACTIVE.reset(reset)
    return run


def _new_region(token: int, name: str, instances: list[str], shared: bool, mods: dict,
                backend: Callable) -> None:
    region = Region(name, tuple(instances), shared)
    # A code object of its own per region: Dynamo's recompile limit and guard failures are
    # per code object, and unrelated regions must not count against each other.
    code = _call_layer.__code__.replace(co_name=f"trainc_region_{token}_{len(_REGIONS)}")
    fn = types.FunctionType(code, _call_layer.__globals__, code.co_name)
    region.compiled = torch.compile(fn, backend=_counting(region, code, backend(region)),
                                    dynamic=False)
    _REGIONS[(token, name)] = region
    for inst in instances:
        mod = mods[inst]
        mod.__dict__[_KEY] = name
        mod.__dict__["_trainc_instance"] = inst
        mod.forward = types.MethodType(_region_forward, mod)


def _call_layer(layer, *args, **kwargs):
    return type(layer).forward(layer, *args, **kwargs)


@torch._dynamo.disable  # a graph break too where a layer is called from a traced frame (a
def _region_forward(self, *args, **kwargs):  # Sequential its parent iterates)
    token = _ACTIVE.get()
    region = _REGIONS.get((token, self.__dict__.get(_KEY))) if token is not None else None
    if region is None:  # outside a trainc-compiled call: the module as written, eagerly
        return type(self).forward(self, *args, **kwargs)
    region.calls += 1
    region._current = _instance_name(self)
    records.note_region(region)
    with records.recording() as compiled:
        out = region.compiled(self, *args, **kwargs)
    region.graph_ids += [r.graph_id for r in compiled]
    return out


@torch._dynamo.disable  # the graph break at the owner's call: the loop over layers runs eagerly
def _owner_forward(self, *args, **kwargs):
    return type(self).forward(self, *args, **kwargs)


def _counting(region: Region, code: types.CodeType, backend: Callable) -> Callable:
    """The Dynamo backend of `region`: counts its graphs and, where an instance did not reuse
    the graph another instance compiled for the same inputs, warns with the failing guard."""
    def compile_region(gm, example_inputs):
        region.dynamo_graphs += 1
        sig = (torch.is_grad_enabled(), tuple(
            (tuple(x.shape), x.dtype, x.requires_grad) for x in example_inputs
            if isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter)))
        first = region._seen.setdefault(sig, region._current)
        if first != region._current:
            guard = _last_guard_failure(code)
            region.not_reused.append((region._current, guard))
            if len(region.not_reused) == 1:
                warnings.warn(
                    f"trainc regions: {region._current} did not reuse the graph compiled for "
                    f"{first} ({region.name}): Dynamo guard failed: {guard}. Each such instance "
                    "compiles its own graph (after torch._dynamo.config.recompile_limit = "
                    f"{torch._dynamo.config.recompile_limit}, Dynamo runs the rest eagerly). "
                    "Per-instance state read in the layer causes this (transformers: call the "
                    "model with use_cache=False when training).", stacklevel=2)
        return backend(gm, example_inputs)
    return compile_region


def _last_guard_failure(code: types.CodeType) -> str:
    failures = getattr(torch._dynamo.guards, "guard_failures", {}).get(code) or []
    text = failures[-1] if failures else "unknown (torch._dynamo.guards.guard_failures empty)"
    return " ".join(text.split("User stack trace")[0].split())[:300]


def _instance_name(mod: torch.nn.Module) -> str:
    return mod.__dict__.get("_trainc_instance", type(mod).__name__)


def _signature(mod: torch.nn.Module) -> tuple:
    return (type(mod),) + tuple((n, tuple(t.shape), t.dtype) for n, t in itertools.chain(
        mod.named_parameters(), mod.named_buffers()))


def _parent(model: torch.nn.Module, path: str) -> torch.nn.Module:
    return model.get_submodule(path.rpartition(".")[0]) if "." in path else model


def _owner_path(mods: dict, owner: torch.nn.Module) -> str:
    return next(p for p, m in mods.items() if m is owner)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
