"""Captured graph + example inputs -> one functional joint forward+backward graph (JointGraph).

Two traces: make_fx over autograd (forward, then torch.autograd.grad) gives a graph that may still
mutate; re-tracing it under functionalization removes every mutation (skipped when the first
graph writes nothing: it would trace the same program again). Input mutations come
out as extra leading outputs; outputs that alias inputs or each other are regenerated later.
"""
from __future__ import annotations

import contextlib
import operator
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                           DynamicOutputShapeException, FakeTensorMode)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.multiprocessing.reductions import StorageWeakRef

from trainc import attention, decomps, regions, rng, scalars
from trainc.graph import (GraphSignature, InputInfo, InputKind, JointGraph, OutputInfo,
                          OutputKind, is_dense)


_getitem = operator.getitem


class UnsupportedError(RuntimeError):
    """A program trainc refuses to compile; the message names the construct."""


@dataclass(frozen=True)
class _Analysis:
    meta_mutated: tuple[bool, ...]
    outputs: tuple[OutputInfo, ...]
    computed: tuple[int, ...]  # user-output index per computed output; -1 - g: hidden base of g
    tangents: tuple[int, ...]
    computed_strides: tuple[tuple[int, ...], ...]
    tangent_examples: tuple  # fake tensors shaped like the outputs that get tangents


def trace_joint(gm: fx.GraphModule, args: Sequence, kinds: Sequence[InputKind],
                training: bool, fuse_attention: bool = True) -> JointGraph:
    """Trace `gm(*args)` (and, when training, its backward) into a functional joint graph."""
    scalar_inputs = scalars.read_by_item(gm, args)
    # .item() of a scalar input traces as an unbacked symbol (scalars.tensorize rewrites it)
    mode = FakeTensorMode(allow_non_fake_inputs=True, static_shapes=True,
                          shape_env=ShapeEnv() if scalar_inputs else None)
    fakes = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    requires_grad = [training and isinstance(a, torch.Tensor) and a.requires_grad for a in args]
    with mode, _data_dependent_is_unsupported(), _unbacked_ignored(mode):
        info = _analyze(gm, fakes, requires_grad, training)
        training = training and bool(info.tangents)
        seed = torch.empty((), dtype=torch.int64)
        tangents = list(info.tangent_examples) if training else []
    fn, grads, rewrites = _joint_fn(gm, info, requires_grad, training, len(args), fuse_attention)
    with mode, _data_dependent_is_unsupported():
        functional = trace_functional(fn, *fakes, seed, *tangents)
        if scalar_inputs:
            functional = scalars.tensorize(functional, scalar_inputs)
    has_rng, mutated = finish_graph(functional, len(args), len(tangents))
    for i in mutated:
        if requires_grad[i] and training:
            raise UnsupportedError(f"trainc: graph input {i} requires grad and is mutated in "
                                   "place; unsupported")
    inputs = tuple(
        InputInfo(f"primals_{i}", kinds[i], requires_grad[i] and training, i in mutated,
                  info.meta_mutated[i]) for i in range(len(args)))
    if has_rng:
        inputs += (InputInfo("seed", InputKind.SEED, False),)
    sig = GraphSignature(inputs=inputs, outputs=info.outputs, computed=len(info.computed),
                         computed_strides=info.computed_strides,
                         tangents=info.tangents if training else (),
                         grads=tuple(grads) if training else (), training=training)
    return JointGraph(functional, sig, rewrites[0])


def _unbacked_ignored(mode: FakeTensorMode):
    """The analysis run's .item() symbols are not graph values: make_fx must not look for them."""
    env = mode.shape_env
    return env.ignore_fresh_unbacked_symbols() if env is not None else contextlib.nullcontext()


def trace_functional(fn, *args) -> fx.GraphModule:
    """fn traced by make_fx with trainc's decompositions, then again under functionalization
    when that graph writes anything (the module docstring's two traces; also compile_step's)."""
    gm = make_fx(fn, decomposition_table=decomps.TABLE)(*args)
    if _writes(gm):  # trainc.policy tags survive the second trace (regions.replay)
        gm = make_fx(torch.func.functionalize(regions.replay(gm), remove="mutations"),
                     decomposition_table=decomps.TABLE)(*args)
    return gm


def _writes(gm: fx.GraphModule) -> bool:
    """Whether a traced graph may write to a tensor: an op whose schema mutates (in-place,
    out=), or a call trainc cannot read a schema from."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is _getitem:
            continue
        if not isinstance(node.target, torch._ops.OpOverload) or node.target._schema.is_mutable:
            return True
    return False


@contextlib.contextmanager
def _data_dependent_is_unsupported():
    """Ops whose output shape depends on data (nonzero, boolean-mask indexing in a backward)
    cannot be traced with static shapes: say so instead of failing deep inside make_fx."""
    try:
        yield
    except (DynamicOutputShapeException, DataDependentOutputException) as e:
        raise UnsupportedError(
            f"trainc: {e.func if hasattr(e, 'func') else e} has a data-dependent output shape "
            "(e.g. boolean-mask indexing or nonzero, possibly inside a backward formula); "
            "not supported: compute it outside the compiled region") from e


def _analyze(gm, fakes, requires_grad, training) -> _Analysis:
    """Run the graph once on fake tensors: mutations, output aliasing, which outputs need grad."""
    with torch.set_grad_enabled(training):
        inner = [_detach(f, rg) for f, rg in zip(fakes, requires_grad)]
        before = [_meta(x) for x in inner]
        try:
            outs = _as_list(gm(*inner))
        except RuntimeError as e:
            if "leaf Variable that requires grad is being used in an in-place" not in str(e):
                raise
            raise UnsupportedError(
                "trainc: a graph input that requires grad is mutated in place (e.g. `h += r` on a "
                "value the graph receives after a graph break; with regions='auto', a value a "
                "region's owner returned); unsupported: write it out of place (h = h + r)") from e
    meta_mutated = tuple(_meta(x) != b for x, b in zip(inner, before))  # sizes/strides/offset
    for i, x in enumerate(inner):
        if meta_mutated[i]:
            raise UnsupportedError(f"trainc: graph input {i} has its shape/stride changed in place "
                                   "(t_(), resize_(), as_strided_() ...); this is not supported")
        if isinstance(x, torch.Tensor) and x.requires_grad and not requires_grad[i]:
            raise UnsupportedError(f"trainc: graph input {i} is mutated in place with a value "
                                   "that requires grad; unsupported")
    outputs, computed = _classify_outputs(outs, inner)
    values = [_computed_tensor(outs, k) for k in computed]
    tangents = tuple(i for i, v in enumerate(values)
                     if training and v.requires_grad and (v.is_floating_point() or v.is_complex()))
    examples = tuple(_tangent_like(values[i]) for i in tangents)
    strides = tuple(tuple(v.stride()) for v in values)
    return _Analysis(meta_mutated, tuple(outputs), tuple(computed), tangents, strides, examples)


def _classify_outputs(outs, inner):
    """Decide per output: computed, view of an input, or view of another computed output."""
    input_storage = {StorageWeakRef(x.untyped_storage()): i
                     for i, x in enumerate(inner) if isinstance(x, torch.Tensor)}
    groups: dict[StorageWeakRef, list[int]] = {}
    for k, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            raise UnsupportedError(f"trainc: graph output {k} is a {type(o).__name__}, not a tensor")
        groups.setdefault(StorageWeakRef(o.untyped_storage()), []).append(k)
    outputs: list = [None] * len(outs)
    computed: list[int] = []
    for ref, members in groups.items():
        # A view that reinterprets the dtype (view_as_complex, view(dtype)) cannot be rebuilt
        # with as_strided on its base, nor can a view of an input whose own elements overlap
        # (an expanded input: as_strided's backward would sum the aliased positions). Such
        # outputs are computed instead (their aliasing with the base is lost).
        odd = [k for k in members if ref in input_storage and
               (outs[k].dtype != inner[input_storage[ref]].dtype
                or not _dense(inner[input_storage[ref]]))]
        odd += [k for k in members if ref not in input_storage and outs[k]._base is not None
                and outs[k].dtype != outs[k]._base.dtype]
        for k in odd:
            outputs[k] = _computed_info(len(computed), outs[k])
            computed.append(k)
        members = [k for k in members if k not in odd]
        if not members:
            continue
        if ref in input_storage:
            base = inner[input_storage[ref]]
            for k in members:
                outputs[k] = _view_info(OutputKind.ALIAS_OF_INPUT, input_storage[ref], outs[k], base)
            continue
        roots = [k for k in members if outs[k]._base is None]
        # A lone view can be computed on its own, unless its layout overlaps (expand): then,
        # as for several views of one intermediate, the intermediate is computed instead.
        if roots or (len(members) == 1 and _dense(outs[members[0]])):
            base_k = roots[0] if roots else members[0]
            base_c, base_t = len(computed), outs[base_k]
            computed.append(base_k)
            outputs[base_k] = _computed_info(base_c, base_t)
        else:  # every member is a view of an intermediate: compute that intermediate too
            base_t = outs[members[0]]._base
            base_c = len(computed)
            computed.append(-1 - members[0])
        for k in members:
            if outputs[k] is None:
                outputs[k] = _view_info(OutputKind.ALIAS_OF_OUTPUT, base_c, outs[k], base_t)
    return outputs, computed


def _dense(t: torch.Tensor) -> bool:
    return is_dense(t.shape, t.stride())


def _computed_tensor(outs, k: int) -> torch.Tensor:
    return outs[k] if k >= 0 else outs[-1 - k]._base


def _computed_info(c: int, t: torch.Tensor) -> OutputInfo:
    return OutputInfo(OutputKind.COMPUTED, c, tuple(t.shape), tuple(t.stride()), 0,
                      t.requires_grad)


def _view_info(kind: OutputKind, base: int, t: torch.Tensor, base_t: torch.Tensor) -> OutputInfo:
    return OutputInfo(kind, base, tuple(t.shape), tuple(t.stride()),
                      t.storage_offset() - base_t.storage_offset(), t.requires_grad)


def _joint_fn(gm, info: _Analysis, requires_grad, training: bool, n: int, fuse_attention: bool):
    """The function make_fx traces: forward (explicit attention rewritten, trainc/attention.py),
    then the vjp of the outputs that need grads."""
    grads: list[int] = []
    rewrites = [0]

    def joint(*flat):
        primals, seed, tangents = flat[:n], flat[n], flat[n + 1:]
        with rng.tracing(seed), torch.set_grad_enabled(training):
            inner = [_detach(p, rg) for p, rg in zip(primals, requires_grad)]
            with attention.tracing(fuse_attention) as att:
                outs = _as_list(regions.replay(gm)(*inner))
            rewrites[0] = att.rewrites if att is not None else 0
            computed = [_computed_tensor(outs, k) for k in info.computed]
            if not training:
                return computed
            wrt = [i for i, rg in enumerate(requires_grad) if rg]
            gs = torch.autograd.grad([computed[t] for t in info.tangents], [inner[i] for i in wrt],
                                     list(tangents), allow_unused=True)
        grads[:] = [i for i, g in zip(wrt, gs) if g is not None]
        return [*computed, *[g for g in gs if g is not None]]

    return joint, grads, rewrites


def finish_graph(gm: fx.GraphModule, n: int, n_tangents: int) -> tuple[bool, list[int]]:
    """Flat positional signature and stable names; each input write-back `copy_(input, v)`
    becomes a leading output v. Returns (has_rng, indices of mutated inputs)."""
    g = gm.graph
    placeholders = [p for p in g.nodes if p.op == "placeholder"]
    names = [f"primals_{i}" for i in range(n)] + ["seed"] + [f"tangents_{i}" for i in range(n_tangents)]
    for p, name in zip(placeholders, names):
        p.name = p.target = name
    new_values: dict[int, fx.Node] = {}
    for node in list(g.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default \
                and node.args[0].op == "placeholder":
            i = placeholders.index(node.args[0])
            if i >= n or i in new_values or node.users:
                raise UnsupportedError(f"trainc: unexpected write-back into {node.args[0].name}")
            new_values[i] = node.args[1]
            g.erase_node(node)
    out = g.output_node()
    mutated = sorted(new_values)
    out.args = ([new_values[i] for i in mutated] + list(out.args[0]),)
    seed = placeholders[n]
    has_rng = bool(seed.users)
    if not has_rng:
        g.erase_node(seed)
    g._codegen = fx.graph.CodeGen()
    g.lint()
    gm.recompile()
    return has_rng, mutated


def _detach(x, requires_grad: bool):
    if not isinstance(x, torch.Tensor):
        return x
    return x.detach().requires_grad_(True) if requires_grad else x.detach()


def _meta(x):
    if not isinstance(x, torch.Tensor):
        return ()
    return (tuple(x.shape), tuple(x.stride()), x.storage_offset())


def _as_list(outs) -> list:
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _tangent_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)
