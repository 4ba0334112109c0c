"""Scalar graph inputs (Python int/float/bool, SymInt/SymFloat, Dynamo's 0-d tensor + .item()
for an unspecialized float) -> 0-d tensor inputs that every backend reads at run time.

Capture turns each scalar placeholder into a 0-d tensor placeholder read by `.item()`
(`lift`); the joint trace then holds `_local_scalar_dense` of it, which `tensorize` rewrites
into tensor ops with eager's dtypes. Anything it cannot rewrite (a scalar used as a size, a
branch on its value, an op without a tensor overload) raises `ScalarFallback`: capture then
bakes the values in (`specialize`) and keys its cache on them, so a new value recompiles.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx as fx

aten = torch.ops.aten
WIDE = {float: torch.float64, int: torch.int64, bool: torch.bool}  # Python's own precision
_ITEM = ("item", aten._local_scalar_dense.default, aten.item.default)


class ScalarFallback(Exception):
    """A scalar input the traced graph uses in a way tensorize does not rewrite."""


def _python_type(v: Any) -> Optional[type]:
    for t in (bool, int, float):  # bool first: it is an int
        if isinstance(v, t) or isinstance(v, getattr(torch, f"Sym{t.__name__.capitalize()}")):
            return t
    return None


def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _is_item(node: fx.Node) -> bool:
    return node.target in _ITEM and node.op in ("call_method", "call_function")


def read_by_item(gm: fx.GraphModule, args: Sequence) -> list[int]:
    """Positions of 0-d tensor inputs the graph only reads through `.item()`."""
    return [i for i, (p, a) in enumerate(zip(_placeholders(gm), args))
            if isinstance(a, torch.Tensor) and a.dim() == 0 and p.users
            and all(_is_item(u) for u in p.users)]


def lift(gm: fx.GraphModule, args: Sequence) -> tuple[fx.GraphModule, dict[int, torch.dtype]]:
    """A copy of gm whose Python-number inputs are 0-d tensors read by `.item()`, and the
    dtype each such input is passed in (to_tensors). gm itself is left as it is."""
    lifted = {i: WIDE[_python_type(a)] for i, (p, a) in enumerate(zip(_placeholders(gm), args))
              if _python_type(a) is not None and not _sizes_use(gm, p)}
    if not lifted:
        return gm, lifted
    new = _copy(gm)
    for k, p in enumerate(_placeholders(new)):
        if k in lifted:
            p.type, p.meta = torch.Tensor, {}
            with new.graph.inserting_after(p):
                item = new.graph.call_method("item", (p,))
            p.replace_all_uses_with(item, delete_user_cb=lambda u, item=item: u is not item)
    new.recompile()
    return new, lifted


def _sizes_use(gm: fx.GraphModule, p: fx.Node) -> bool:
    """Whether Dynamo's symbol for this input is one of a tensor input's sizes (dynamic
    shapes): such inputs are specialized, as trainc compiles static shapes."""
    sym = p.meta.get("example_value", p.meta.get("val"))
    if not isinstance(sym, (torch.SymInt, torch.SymFloat)):
        return False
    free = sym.node.expr.free_symbols
    for q in _placeholders(gm):
        v = q.meta.get("example_value", q.meta.get("val"))
        if isinstance(v, torch.Tensor) and any(
                isinstance(s, torch.SymInt) and free & s.node.expr.free_symbols
                for s in (*v.shape, *v.stride())):
            return True
    return False


def to_tensors(args: Sequence, lifted: dict[int, torch.dtype]) -> list:
    """The call's arguments with each lifted Python number made a 0-d tensor."""
    out = list(args)
    for i, dtype in lifted.items():
        out[i] = torch.tensor(out[i], dtype=dtype)
    return out


def specialize(gm: fx.GraphModule, positions: Sequence[int], args: Sequence) -> fx.GraphModule:
    """A copy of gm with each `.item()` of these inputs replaced by the value in args (the
    placeholders stay, unread)."""
    new = _copy(gm)
    ps = _placeholders(new)
    for i in positions:
        value = args[i].item()
        for u in list(ps[i].users):
            u.replace_all_uses_with(value)
            new.graph.erase_node(u)
    new.recompile()
    return new


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    """gm with a graph of its own (node meta copied shallowly), sharing its attributes."""
    graph = fx.Graph()
    graph._codegen = gm.graph._codegen
    graph.output(graph.graph_copy(gm.graph, {}))
    return fx.GraphModule(gm, graph)


# Python arithmetic on scalars (SymFloat/SymInt ops make_fx records) -> ATen ops on 0-d tensors
# of Python's precision (float64, int64), which round exactly as Python does.
_SYM_OPS: dict[Callable, Callable] = {
    operator.add: aten.add.Tensor, operator.sub: aten.sub.Tensor, operator.mul: aten.mul.Tensor,
    operator.truediv: aten.div.Tensor, operator.neg: aten.neg.default,
    operator.pow: aten.pow.Tensor_Tensor, operator.mod: aten.remainder.Tensor,
    operator.abs: aten.abs.default, operator.eq: aten.eq.Tensor, operator.ne: aten.ne.Tensor,
    operator.lt: aten.lt.Tensor, operator.le: aten.le.Tensor, operator.gt: aten.gt.Tensor,
    operator.ge: aten.ge.Tensor, torch.sym_max: aten.maximum.default,
    torch.sym_min: aten.minimum.default, torch.sym_sqrt: aten.sqrt.default,
    math.sqrt: aten.sqrt.default,
}
_CASTS = (torch.sym_float, torch.sym_int, float, int)
_REDUCED = (torch.bfloat16, torch.float16)


def tensorize(gm: fx.GraphModule, positions: Sequence[int]) -> fx.GraphModule:
    """Rewrite a traced graph's `_local_scalar_dense` of these 0-d tensor placeholders into
    tensor ops reading the placeholders; ScalarFallback where that is not possible."""
    inputs = {_placeholders(gm)[i] for i in positions}
    held: dict[fx.Node, fx.Node] = {}  # scalar-valued node -> 0-d tensor node holding it
    for node in gm.graph.nodes:
        if node.target is aten._local_scalar_dense.default and \
                _source(node.args[0]) in inputs:
            held[node] = node.args[0]
    rw = _Rewriter(gm, held)
    for node in list(gm.graph.nodes):
        if node in held or not any(a in held for a in _flat(node.args, node.kwargs)):
            continue
        if node.op != "call_function":
            raise ScalarFallback(f"scalar input read by {node.op} {node.name}")
        if isinstance(node.target, torch._ops.OpOverload):
            rw.aten_op(node)
        elif node.target in _SYM_OPS or node.target in _CASTS or node.target is operator.floordiv:
            rw.sym_op(node)
        else:
            raise ScalarFallback(f"scalar input read by {node.target}")
    for node in reversed(list(held)):
        if node.op != "placeholder":
            if node.users:
                raise ScalarFallback(f"scalar {node.name} still read")
            gm.graph.erase_node(node)
    _check_no_symbols(gm)
    gm.graph.lint()
    gm.recompile()
    return gm


def _source(node: fx.Node) -> fx.Node:
    """The placeholder a chain of aliases (the trace's detach of each input) reads."""
    while node.op == "call_function" and node.target in _ALIASES:
        node = node.args[0]
    return node


_ALIASES = (aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)


def _check_no_symbols(gm: fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        v = node.meta.get("val")
        vals = v if isinstance(v, (list, tuple)) else [v]
        for x in vals:
            if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) or (
                    isinstance(x, torch.Tensor) and any(
                        isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride()))):
                raise ScalarFallback(f"{node.name} is symbolic")


def _flat(*trees) -> list:
    out = []
    for t in trees:
        if isinstance(t, (list, tuple)):
            out += _flat(*t)
        elif isinstance(t, dict):
            out += _flat(*t.values())
        else:
            out.append(t)
    return out


def _val(a):
    return a.meta["val"] if isinstance(a, fx.Node) else a


class _Rewriter:
    def __init__(self, gm: fx.GraphModule, held: dict[fx.Node, fx.Node]):
        self.gm, self.held = gm, held
        self.casts: dict[tuple, fx.Node] = {}  # (node, dtype, device) -> its cast

    def new(self, target, args: tuple, kwargs: Optional[dict] = None) -> fx.Node:
        kwargs = kwargs or {}
        node = self.gm.graph.call_function(target, args, kwargs)
        node.meta["val"] = target(*[_val(a) for a in args],
                                  **{k: _val(v) for k, v in kwargs.items()})
        return node

    def cast(self, t: fx.Node, dtype: torch.dtype, fresh: bool = False,
             device: Optional[torch.device] = None) -> fx.Node:
        if t.meta["val"].dtype == dtype and not fresh:
            return t
        kw = {"dtype": dtype} | ({"device": device} if device is not None else {})
        key = (t, dtype, device)
        if key not in self.casts or fresh:
            self.casts[key] = self.new(aten._to_copy.default, (t,), kw)
        return self.casts[key]

    def replace(self, old: fx.Node, new: fx.Node) -> None:
        o, n = old.meta["val"], new.meta["val"]
        if not (isinstance(o, torch.Tensor) and isinstance(n, torch.Tensor)
                and o.dtype == n.dtype and o.shape == n.shape and o.device == n.device):
            raise ScalarFallback(f"{old.name}: rewritten with another dtype, shape or device")
        old.replace_all_uses_with(new)
        self.gm.graph.erase_node(old)

    def aten_op(self, node: fx.Node) -> None:
        """An ATen op with a scalar argument -> its overload taking that argument as a
        tensor, the 0-d tensor in the dtype eager converts the scalar to."""
        op, out = node.target, node.meta.get("val")
        if not isinstance(out, torch.Tensor):
            raise ScalarFallback(f"{op} returns no single tensor")
        with self.gm.graph.inserting_before(node):
            if op in (aten.full.default, aten.scalar_tensor.default):
                return self._fill(node, out)
            names = [a.name for a in op._schema.arguments]
            bound = dict(zip(names, node.args)) | dict(node.kwargs)
            scalar = {k for k, v in bound.items() if v in self.held}
            target = _tensor_overload(op, scalar, {k for k in names if bound.get(k) is None})
            if target is None or any(isinstance(v, (list, tuple)) and set(v) & set(self.held)
                                     for v in bound.values()):
                raise ScalarFallback(f"{op} takes a scalar input where no tensor can go")
            dtype = _scalar_dtype(out, [v for k, v in bound.items() if k not in scalar],
                                  _python_type(_val(bound[next(iter(scalar))])))
            new_args = [self.cast(self.held[a], dtype) if a in self.held else a
                        for a in node.args]
            new_kwargs = {k: self.cast(self.held[v], dtype) if v in self.held else v
                          for k, v in node.kwargs.items()}
            new = self.new(target, tuple(new_args), new_kwargs)
        self.replace(node, new)

    def _fill(self, node: fx.Node, out: torch.Tensor) -> None:
        value = node.args[1] if node.target is aten.full.default else node.args[0]
        sizes = node.args[0] if node.target is aten.full.default else ()
        if value not in self.held or out.dtype == torch.bool or any(
                a in self.held for a in _flat(sizes)):
            raise ScalarFallback(f"{node.target}: a scalar input as a size")
        moved = out.device if out.device != self.held[value].meta["val"].device else None
        t = self.cast(self.held[value], out.dtype, fresh=True, device=moved)
        if node.target is aten.full.default:  # -0.0 + v == v for every v, signed zeros too
            zero = -0.0 if out.dtype.is_floating_point else 0
            base = self.new(aten.full.default, (node.args[0], zero), dict(node.kwargs))
            t = self.new(aten.add.Tensor, (base, t))
        self.replace(node, t)

    def sym_op(self, node: fx.Node) -> None:
        """Python arithmetic on scalars -> the same on 0-d float64/int64/bool tensors."""
        kind = _python_type(node.meta.get("val"))
        if kind is None:
            raise ScalarFallback(f"{node.target} of a scalar input")
        kinds = [_python_type(_val(a)) for a in node.args]
        compute = WIDE[float if float in kinds or kind is float else kind]
        if node.target in _CASTS:
            compute = WIDE[kind]
        with self.gm.graph.inserting_before(node):
            args = tuple(self.cast(self.held[a], compute) if a in self.held else
                         self.new(aten.scalar_tensor.default, (a,), {"dtype": compute})
                         for a in node.args)
            if node.target in _CASTS:
                new = args[0]
            elif node.target is operator.floordiv:
                new = self.new(aten.div.Tensor_mode, args, {"rounding_mode": "floor"})
            else:
                new = self.new(_SYM_OPS[node.target], args)
            new = self.cast(new, WIDE[kind])
        self.held[node] = new


def _tensor_overload(op: torch._ops.OpOverload, scalar: set[str], unset: set[str]):
    """The overload of op's packet with the same arguments, those named in `scalar` tensors
    (those in `unset`, passed None, of any optional type)."""
    def tensor_typed(a) -> bool:
        return isinstance(a.type, torch.TensorType) or (
            isinstance(a.type, torch.OptionalType)
            and isinstance(a.type.getElementType(), torch.TensorType))

    args = op._schema.arguments
    if all(tensor_typed(a) for a in args if a.name in scalar):
        return op
    packet = op.overloadpacket
    for name in packet.overloads():
        cand = getattr(packet, name)
        cargs = cand._schema.arguments
        if [a.name for a in cargs] != [a.name for a in args]:
            continue
        if all(tensor_typed(c) if a.name in scalar else str(c.type) == str(a.type) or (
                a.name in unset and isinstance(c.type, torch.OptionalType))
               for a, c in zip(args, cargs)):
            return cand
    return None


def _scalar_dtype(out: torch.Tensor, others: list, kind: type) -> torch.dtype:
    """The dtype eager converts a Python scalar to in an op with these other arguments: the
    op's result type (so a 0-d tensor promotes as the number would), float32 for a 16-bit
    float beside a tensor of dims (eager computes it in float32)."""
    tensors = [_val(a) for a in others if isinstance(_val(a), torch.Tensor)]
    if out.dtype != torch.bool:
        dtype = out.dtype
    elif tensors:
        dtype = torch.result_type(tensors[0], kind(1))
    else:
        dtype = WIDE[kind]
    if dtype in _REDUCED and any(t.dim() > 0 for t in tensors):
        return torch.float32
    return dtype
