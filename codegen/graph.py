"""FX graph of core ATen ops -> LoweredGraph: buffers, compute nodes (loop IR) and ATen calls.

Each FX node lowers through the registry to a lazy TensorValue; values are realized into
buffers only where fusion cannot inline them (several expensive uses, externs, outputs). An
in-place op lowers as its functional form plus a hint (`LoweredGraph.reuse`) that its result may
live in the written buffer's storage; codegen/memory/inplace.py decides after scheduling.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import sympy
import torch
import torch.fx as fx

from trainc.codegen import dumps, functional, ir
from trainc.graph import OFFLOAD_NODE, is_dense
from trainc.codegen.ir import TensorValue
from trainc.codegen.symbols import Symbols
from trainc.passes.reinplace_ops import MUTABLE_INPUTS

# A value with several users is recomputed in each when its ops cost at most this much
# (ir.compute_cost: 1 per arithmetic op, 5 per transcendental; casts and loads are free): a
# one-hot scaled by a row's weight (cross_entropy's backward) is recomputed, not stored.
INLINE_LIMIT = 8
BROADCAST_INLINE_LIMIT = 32  # the same for a value read from data much smaller than itself
EXPR_LIMIT = 120  # a value whose expression grew past this many nodes is materialized
# Triton: a one-element value whose ops cost this much is stored once, not inlined into its
# users: an optimizer's bias corrections (float64 pow of the step count) inlined into a weight
# update were computed again by every GPU thread of it; stored, the scheduler's small-node rule
# puts them together in a small kernel. (cpp: GCC hoists them out of the loops itself.)
SCALAR_LIMIT = 5
# A value with a transcendental in it whose readers (through views) evaluate it at this many times
# its own elements is stored once: inlined, each reader's element computes it again (a rotary
# embedding's cos/sin, broadcast over every head of every layer).
BROADCAST_LIMIT = 4
# node.meta key: store the value where the node stands, not where a later reader inlines it
# (a gradient added into .grad right after the extern that made it, while it is hot in cache)
STORE_NOW = "trainc_store_now"


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    kind: str  # "input" | "const" | "compute" | "call"

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * _itemsize(self.dtype)


@dataclass
class ComputeNode:
    """One buffer computed by generated code.

    pointwise: out[i] = fn(i) over `shape`.  reduction: out[i] = reduce_op over r of fn(i, r),
    r over `rshape`.  scatter: out = init(i); then for v over `rshape`: out[index(v)] op= fn(v).
    """
    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    fn: Callable
    rshape: tuple[int, ...] = ()
    reduce_op: str = ""
    init: Optional[Callable] = None
    index: Optional[Callable] = None
    origins: tuple[str, ...] = ()
    # compile_step with a budget tags forward (0) and backward (1, 2, ...: a new region at each
    # run of recomputed copies) nodes; kernels never mix regions, or a recomputed value would
    # be fused back into an earlier kernel and kept alive
    region: int = 0


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument of an ATen call: a buffer, or a strided view of one."""
    buf: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    whole: bool  # the buffer itself, no as_strided needed


@dataclass
class CallNode:
    kind: str  # "extern" | "fallback"
    target: Any
    args: tuple
    kwargs: dict
    outputs: tuple[str, ...]  # buffer names, in the op's flattened result order
    origin: str = ""
    # The in-place / out= op this functional call replaces and the written argument (position
    # or kwarg name): the wrapper runs it instead when the storage plan allows.
    inplace: Optional[tuple[Any, Any]] = None
    # Buffers made by calls this one must follow (an order, not a read: nothing keeps them).
    after: tuple[str, ...] = ()


@dataclass
class LoweredGraph:
    buffers: dict[str, Buffer] = field(default_factory=dict)
    steps: list = field(default_factory=list)  # ComputeNode | CallNode, in program order
    inputs: list[str] = field(default_factory=list)  # placeholder buffers, in order
    # every placeholder's name in the wrapper's unpacking of its arguments: its buffer, or
    # "_" for a Python number the graph has baked in (the caller still passes it)
    params: list[str] = field(default_factory=list)
    consts: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: list = field(default_factory=list)  # TensorArg | python value per graph output
    # buffer -> buffer whose storage it may take (an in-place op's result and the buffer the
    # op wrote); only a hint: codegen/memory/inplace.py checks it against the schedule
    reuse: dict[str, str] = field(default_factory=dict)
    storage: dict[str, str] = field(default_factory=dict)  # the hints storage.py accepted
    symbols: Symbols = field(default_factory=Symbols)  # index symbols, numbered per graph
    # (the OFFLOAD_NODE tag, its buffer stored whole): what an in-graph offload may move
    offloadable: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return dumps.lowered_text(self)


class GraphLowering:
    """The lowering context handed to every lowering function.

    `channels_last`: 2-D convolutions take their activations channels-last (NHWC in memory),
    as cuDNN and oneDNN run them fastest; the values around them follow (`_preferred_layout`),
    so the layout changes once, not at every convolution. A bool for every convolution, or a
    rule deciding per convolution node (forward or backward).
    `store_scalars`: one-element values with a transcendental in them are stored once, not
    inlined (SCALAR_LIMIT; Triton, where every thread of a kernel would compute them again)."""

    def __init__(self, gm: fx.GraphModule,
                 channels_last: Union[bool, Callable[[fx.Node], bool]] = False,
                 store_scalars: bool = False, aten_nodes: frozenset[str] = frozenset()):
        self.gm, self.g = gm, LoweredGraph()
        self.aten_nodes = aten_nodes  # computed by ATen calls, not lowered (Config.aten_nodes)
        self.conv_rule = channels_last if callable(channels_last) else (
            lambda node, on=bool(channels_last): on)
        self.channels_last = any(self.conv_rule(n) for n in gm.graph.nodes
                                 if n.op == "call_function" and n.target in CONVOLUTIONS)
        self.store_scalars = store_scalars
        self.env: dict[fx.Node, Any] = {}
        self.node: Optional[fx.Node] = None
        self._names = 0
        # id of a lazy in-place result -> (that value, the buffer whose storage it may take)
        self._hints: dict[int, tuple[TensorValue, str]] = {}
        self._input_bufs: dict[str, str] = {}  # placeholder name -> its input buffer
        self._as_args: dict[int, tuple] = {}  # id of a lazy value -> (it, its realized buffer)

    # -- buffers ------------------------------------------------------------------------
    def new_buffer(self, shape, dtype, kind: str, stride=None, prefix: str = "buf") -> str:
        name = f"{prefix}{self._names}"
        self._names += 1
        shape = tuple(int(s) for s in shape)
        stride = ir.contiguous_strides(shape) if stride is None else tuple(int(s) for s in stride)
        self.g.buffers[name] = Buffer(name, shape, stride, dtype, kind)
        return name

    def realize(self, v: TensorValue, stride=None) -> TensorValue:
        """Materialize a lazy value into a buffer computed by a pointwise node: contiguous, or
        laid out as `stride`, or (None) as `_preferred_layout` says. A dense permuted layout
        (channels-last) is computed in memory order: the buffer is the permuted shape,
        contiguous, and the value a permuted view of it."""
        if self.is_buffer(v) or (stride is None and self._is_whole_view(v)):
            return v
        hint = self._hints.get(id(v))
        hint = hint if hint is not None and hint[0] is v else None
        if stride is None and (hint is None or
                               self.g.buffers[hint[1]].kind in ("compute", "call")):
            # an in-place update of a graph input (a parameter) keeps the input's layout; an
            # intermediate's in-place hint gives way to the layout (the hint is then dropped)
            stride = self._preferred_layout(v)
        order = _memory_order(v.shape, stride)
        if order is not None:
            return self._realize_permuted(v, stride, order)
        name = self.new_buffer(v.shape, v.dtype, "compute", stride)
        self.g.steps.append(ComputeNode(name, "pointwise", v.shape, v.dtype, v.fn,
                                        origins=self._origin(), region=self._region()))
        if hint is not None:
            self.g.reuse.setdefault(name, hint[1])
        return self.load(name)

    def _realize_permuted(self, v: TensorValue, stride, order: list[int]) -> TensorValue:
        shape = tuple(v.shape[d] for d in order)
        name = self.new_buffer(shape, v.dtype, "compute")
        back = [order.index(d) for d in range(len(order))]  # dim d of v is dim back[d] here
        fn = v.fn
        self.g.steps.append(ComputeNode(name, "pointwise", shape, v.dtype,
                                        lambda j: fn([j[back[d]] for d in range(len(back))]),
                                        origins=self._origin(), region=self._region()))
        return ir.buffer_value(name, v.shape, stride, v.dtype)

    def _is_whole_view(self, v: TensorValue) -> bool:
        """v reads all of one buffer in a dense layout (a permuted realization)."""
        if v.view is None or v.view.offset != 0:
            return False
        b = self.g.buffers[v.view.buf]
        return b.dtype == v.dtype and math.prod(b.shape) == v.numel and \
            is_dense(v.shape, v.view.stride)

    def _preferred_layout(self, v: TensorValue) -> Optional[tuple[int, ...]]:
        """Channels-last for a 4-D value whose loads (those varying along both C and W) run
        along the channels more often than along W: a normalization, activation or pooling of
        a channels-last value. None: contiguous."""
        if not self.channels_last or len(v.shape) != 4 or v.shape[1] == 1 or v.shape[3] == 1:
            return None
        syms = self.g.symbols.ranges("l", v.shape)
        along_c = along_w = 0
        for load in ir.loads(v(syms)):
            index = sympy.sympify(load.index)
            dc, dw = index.diff(syms[1]), index.diff(syms[3])
            if dc == 0 or dw == 0:
                continue
            along_c += dc == 1
            along_w += dw == 1
        return _channels_last(v.shape) if along_c > along_w else None

    def to_channels_last(self, v: TensorValue) -> TensorValue:
        """A 4-D value as a convolution argument: channels-last in memory."""
        cl = _channels_last(v.shape)
        if v.view is not None and self.g.buffers[v.view.buf].dtype == v.dtype and \
                all(n == 1 or a == b for n, a, b in zip(v.shape, v.view.stride, cl)):
            return v
        return self.realize(TensorValue(v.shape, v.dtype, v.fn), cl)

    def reduction(self, shape, rshape, reduce_op: str, dtype, fn: Callable) -> TensorValue:
        """A buffer `shape` = reduce_op over `rshape` of fn(i, r)."""
        name = self.new_buffer(shape, dtype, "compute")
        self.g.steps.append(ComputeNode(name, "reduction", tuple(shape), dtype, fn,
                                        tuple(int(s) for s in rshape), reduce_op,
                                        origins=self._origin(), region=self._region()))
        return self.load(name)

    def scatter(self, shape, dtype, init: Callable, vshape, fn: Callable, index: Callable,
                mode: str) -> TensorValue:
        name = self.new_buffer(shape, dtype, "compute")
        self.g.steps.append(ComputeNode(name, "scatter", tuple(shape), dtype, fn, tuple(vshape),
                                        mode, init, index, self._origin(), self._region()))
        return self.load(name)

    def load(self, name: str) -> TensorValue:
        b = self.g.buffers[name]
        return ir.buffer_value(name, b.shape, b.stride, b.dtype)

    def is_buffer(self, v: TensorValue) -> bool:
        if v.view is None or v.view.offset != 0:
            return False
        b = self.g.buffers[v.view.buf]
        return b.shape == v.shape and b.stride == v.view.stride and b.dtype == v.dtype

    def tensor_arg(self, v: TensorValue) -> TensorArg:
        """A value as an ATen call argument: strided views pass through, others are realized,
        once for all the calls reading them (q/k/v projections of one normalized input)."""
        if v.view is None or self.g.buffers[v.view.buf].dtype != v.dtype:
            done = self._as_args.get(id(v))
            if done is None or done[0] is not v:
                done = self._as_args[id(v)] = (v, self.realize(v))
            v = done[1]
        b = self.g.buffers[v.view.buf]
        whole = b.shape == v.shape and b.stride == v.view.stride and v.view.offset == 0
        return TensorArg(v.view.buf, v.shape, v.view.stride, v.view.offset, whole)

    def call(self, kind: str, target, args: tuple, kwargs: dict, result,
             after: tuple[str, ...] = ()) -> Any:
        """An ATen call in the wrapper; `result` is the FakeTensor (or tuple) it returns;
        `after`: buffers of calls it must follow."""
        conv = lambda a: self.tensor_arg(a) if isinstance(a, TensorValue) else a
        args = _map(conv, args)
        kwargs = {k: _map(conv, v) for k, v in kwargs.items()}
        if target in CONVOLUTIONS:  # its result's layout follows its arguments' (channels-last)
            result = self._result_for_layouts(target, args, kwargs, result)
        flat = result if isinstance(result, (list, tuple)) else [result]
        names, values = [], []
        for r in flat:
            if isinstance(r, torch.Tensor):
                names.append(self.new_buffer(r.shape, r.dtype, "call", r.stride()))
                values.append(self.load(names[-1]))
            else:
                names.append(None)
                values.append(r)
        self.g.steps.append(CallNode(kind, target, args, kwargs, tuple(names),
                                     self.node.name if self.node else "", after=after))
        return type(result)(values) if isinstance(result, (list, tuple)) else values[0]

    def _result_for_layouts(self, target, args, kwargs, traced):
        """What `target` returns for arguments laid out as the lowered graph passes them (the
        traced result assumed the traced layouts): the op run on fake tensors."""
        flat = traced if isinstance(traced, (list, tuple)) else [traced]
        device = next((t.device for t in flat if isinstance(t, torch.Tensor)), None)
        if device is None:
            return traced

        def fake(a):
            if isinstance(a, TensorArg):
                return torch.empty_strided(a.shape, a.stride, dtype=self.g.buffers[a.buf].dtype,
                                           device=device)
            return a
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            out = target(*_map_all(fake, args), **{k: _map_all(fake, v)
                                                   for k, v in kwargs.items()})
        outs = out if isinstance(out, (list, tuple)) else [out]

        def alike(a, b) -> bool:
            if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
                return a is None and b is None
            return a.shape == b.shape and a.dtype == b.dtype
        same = len(outs) == len(flat) and all(alike(a, b) for a, b in zip(outs, flat))
        return out if same else traced

    def _aligned_bias(self, v: TensorValue) -> TensorValue:
        """An attention bias the memory-efficient kernel takes: every stride but the last a
        multiple of BIAS_ALIGN elements (eager SDPA pads it likewise). A misaligned one is
        computed into a buffer whose last dim is padded (the padding repeats the last column,
        never read) and passed as a view of it."""
        view = v.view
        if view is not None and view.offset % BIAS_ALIGN == 0 and \
                all(st % BIAS_ALIGN == 0 for st in view.stride[:-1]) and view.stride[-1] == 1:
            return v
        last = v.shape[-1]
        if view is None and last % BIAS_ALIGN == 0:
            return self.realize(v, ir.contiguous_strides(v.shape))
        padded = (*v.shape[:-1], -(-last // BIAS_ALIGN) * BIAS_ALIGN)
        name = self.new_buffer(padded, v.dtype, "compute")
        self.g.steps.append(ComputeNode(
            name, "pointwise", padded, v.dtype,
            lambda j: v([*j[:-1], sympy.Min(j[-1], last - 1, evaluate=False)]),
            origins=self._origin(), region=self._region()))
        return ir.buffer_value(name, v.shape, ir.contiguous_strides(padded), v.dtype)

    def _conv_args(self, target, args: tuple) -> tuple:
        """A 2-D convolution's activations (input; grad_output too in its backward) as
        channels-last values."""
        n = 2 if target is aten.convolution_backward.default else 1
        args = list(args)
        for k in range(n):
            if isinstance(args[k], TensorValue) and len(args[k].shape) == 4 and \
                    args[k].dtype.is_floating_point:
                args[k] = self.to_channels_last(args[k])
        return tuple(args)

    def _conv_backward_in_two(self, args: tuple, kwargs: dict, traced) -> tuple:
        """grad_weight (and grad_bias) first, then grad_input as the transposed convolution
        of grad_output (the data gradient: cuDNN and oneDNN run the same backward-data kernels
        for it), which does not read the input: where nothing later reads the input, it is
        freed before grad_input exists."""
        op = aten.convolution_backward.default
        g, x, w = (self.tensor_arg(v) for v in args[:3])  # realized once, for both calls
        _, stride, padding, dilation, _, _, groups, mask = args[3:]
        _, gw, gb = self.call("extern", op, (g, x, w, *args[3:-1], [False, True, mask[2]]),
                              kwargs, (None, traced[1], traced[2]))
        # grad_input after grad_weight, whatever the fusion: otherwise the kernel making the
        # input may take later nodes that need grad_input, and the input outlives it again
        first = tuple(b for b in self.g.steps[-1].outputs if b is not None)
        extra = [n_in - ((n_out - 1) * s - 2 * p + d * (k - 1) + 1) for n_in, n_out, k, s, p, d
                 in zip(x.shape[2:], g.shape[2:], w.shape[2:], stride, padding, dilation)]
        gi = self.call("extern", aten.convolution.default,
                       (g, w, None, stride, padding, dilation, True, extra, groups), {},
                       traced[0], after=first)
        return (gi, gw, gb)

    def _origin(self) -> tuple[str, ...]:
        return (self.node.name,) if self.node is not None else ()

    def _region(self) -> int:
        return self.node.meta.get("trainc_region", 0) if self.node is not None else 0

    # -- the walk -------------------------------------------------------------------------
    def run(self, lowerings: dict, is_extern: Callable) -> LoweredGraph:
        self.is_extern = is_extern
        for node in self.gm.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                self.env[node] = self._input(node, "input")
            elif node.op == "get_attr":
                self.env[node] = self._input(node, "const")
            elif node.op == "call_function":
                self.env[node] = self._call(node, lowerings, is_extern)
                self._maybe_realize(node)
                if node.meta.get(OFFLOAD_NODE):
                    self._offloadable(node)
            elif node.op == "output":
                self.g.outputs = [self._output(a) for a in _flat(node.args[0])]
                self._hint_written_back()
        return self.g

    def _hint_written_back(self) -> None:
        """An input the program mutates gets its new value back in an output slot
        (gm.meta[MUTABLE_INPUTS]); where that value was computed into a buffer of its own (no
        in-place op to reinplace: a 16-bit optimizer state updated through a float32
        `_to_copy`), hint that buffer into the input's storage. plan_storage checks it like
        any in-place hint; taken, the runtime's write-back copy finds the input itself."""
        for name, slot in self.gm.meta.get(MUTABLE_INPUTS, {}).items():
            # the input's own buffer (its env entry is its latest value by now: an in-place
            # chain such as BatchNorm's running_mean.mul_(m).add_(...) leaves a computed one)
            t, out = self._input_bufs.get(name), self.g.outputs[slot]
            if (t is not None and isinstance(out, TensorArg) and out.whole and out.buf != t
                    and self.g.buffers[out.buf].kind == "compute"):
                self.g.reuse.setdefault(out.buf, t)

    def _input(self, node: fx.Node, kind: str) -> Any:
        v = node.meta.get("val")
        if kind == "const":
            v = getattr(self.gm, node.target)
        if not isinstance(v, torch.Tensor):
            if kind == "input":
                self.g.params.append("_")
            return v
        name = self.new_buffer(v.shape, v.dtype, kind, v.stride(), prefix="arg")
        if kind == "const":
            self.g.consts[name] = v
        else:
            self.g.inputs.append(name)
            self.g.params.append(name)
            self._input_bufs[node.name] = name
        return self.load(name)

    def _call(self, node: fx.Node, lowerings: dict, is_extern: Callable) -> Any:
        dests = functional.written(node) if isinstance(node.target, torch._ops.OpOverload) \
            else []
        if not dests:
            return self._call_functional(node, lowerings, is_extern)
        pure = functional.functional_variant(node.target)
        if pure is None:
            raise NotImplementedError(f"trainc cpp: no functional form of {node.target}")
        for _, d in dests:
            functional.check_write(node, d)
        old = self._storage_of(self.env.get(dests[0][1])) if len(dests) == 1 else None
        n_steps = len(self.g.steps)
        target, kwargs = node.target, node.kwargs
        node.target = pure  # lowerings dispatch on node.target; restored below
        node.kwargs = {k: v for k, v in kwargs.items() if not isinstance(k, str) or
                       k not in {key for key, _ in dests}}
        try:
            out = self._call_functional(node, lowerings, is_extern)
        finally:
            node.target, node.kwargs = target, kwargs
        for _, d in dests:  # later reads of the written node see the new value
            self.env[d] = out
        if old is not None and isinstance(out, TensorValue):
            self._hint(out, old, target, dests[0][0], n_steps)
        return out

    def _storage_of(self, v) -> Optional[str]:
        """The buffer holding v when v is a whole buffer or a pending in-place result."""
        if not isinstance(v, TensorValue):
            return None
        if self.is_buffer(v):
            return v.view.buf
        hint = self._hints.get(id(v))
        return hint[1] if hint is not None and hint[0] is v else None

    def _hint(self, out: TensorValue, old: str, target, key, n_steps: int) -> None:
        """Record that the in-place op's result `out` may be written into buffer `old`."""
        if not self.is_buffer(out):
            self._hints[id(out)] = (out, old)
            return
        buf = out.view.buf
        if buf == old or self.g.buffers[buf].kind not in ("compute", "call"):
            return
        self.g.reuse.setdefault(buf, old)
        new = self.g.steps[n_steps:]  # the call, after any arguments it realized
        if new and isinstance(new[-1], CallNode) and new[-1].outputs == (buf,):
            new[-1].inplace = (target, key)

    def _call_functional(self, node: fx.Node, lowerings: dict, is_extern: Callable) -> Any:
        args = _map(self._env, node.args)
        kwargs = {k: _map(self._env, v) for k, v in node.kwargs.items()}
        target = node.target
        if target is _getitem:
            return args[0][args[1]]
        if isinstance(target, torch._ops.OpOverload) and is_extern(target):
            if target in CONVOLUTIONS and self.conv_rule(node):
                args = self._conv_args(target, args)
            if target is aten.convolution_backward.default and _split_backward(args):
                return self._conv_backward_in_two(args, kwargs, node.meta.get("val"))
            at = EFFICIENT_ATTENTION.get(target)
            if at is not None and isinstance(args[at], TensorValue):
                args = (*args[:at], self._aligned_bias(args[at]), *args[at + 1:])
            return self.call("extern", target, args, kwargs, node.meta.get("val"))
        fn = lowerings.get(target) if not self._forced_aten(node) else None
        if fn is not None:
            out = fn(self, node, *args, **kwargs)
            if out is not NotImplemented:
                return _map(_rounded, out)
        return self.call("fallback", target, args, kwargs, node.meta.get("val"))

    def _forced_aten(self, node: fx.Node) -> bool:
        """Config.aten_nodes names this node (views stay views: their results alias)."""
        return node.name in self.aten_nodes and not (
            isinstance(node.target, torch._ops.OpOverload) and node.target.is_view)

    def _env(self, a):
        return self.env[a] if isinstance(a, fx.Node) else a

    def _maybe_realize(self, node: fx.Node) -> None:
        v = self.env[node]
        if not isinstance(v, TensorValue) or v.view is not None:
            return
        e = v(self.g.symbols.shared("t", v.shape))
        crosses = _crosses(node)
        if self.store_scalars and math.prod(v.shape) == 1 and not crosses and \
                ir.compute_cost(e) >= SCALAR_LIMIT:
            self.env[node] = self._realize_scalar(v, e)
        elif ir.size_of(EXPR_LIMIT, e) > EXPR_LIMIT or crosses or node.meta.get(STORE_NOW) or \
                (len(node.users) > 1 and ir.compute_cost(e) > self._inline_limit(v, e)) or \
                _broadcast_and_costly(node, v, e) or _extern_readers(node, self.is_extern) > 1:
            narrow = None if crosses else self._store_narrow(node, v)
            self.env[node] = narrow if narrow is not None else self._store(node, v)
        elif _stored_anyway(node, v):
            self.env[node] = self._store(node, v)

    def _store(self, node: fx.Node, v: TensorValue) -> TensorValue:
        """`node`'s value stored for its readers; a graph output in the layout eager gives it
        (its reader, the next graph or the user, would otherwise restride it, and a kernel
        reading channels-last inputs writes it in their order)."""
        return self._realize_as_traced(v, node) if _is_output(node) else self.realize(v)

    def _offloadable(self, node: fx.Node) -> None:
        v = self.env[node]
        if isinstance(v, TensorValue) and self.is_buffer(v) and \
                self.g.buffers[v.view.buf].kind in ("compute", "call"):
            self.g.offloadable.append((str(node.meta[OFFLOAD_NODE]), v.view.buf))

    def _inline_limit(self, v: TensorValue, e: ir.Expr) -> int:
        """INLINE_LIMIT, or BROADCAST_INLINE_LIMIT for a value built only from data at least
        BROADCAST_LIMIT times smaller (a one-hot of per-row labels): stored, it is a full-size
        write and reads that recomputing it does not cost."""
        n = math.prod(v.shape)
        small = all(math.prod(self.g.buffers[x.buf].shape) * BROADCAST_LIMIT <= n
                    for x in ir.loads(e))
        return BROADCAST_INLINE_LIMIT if small else INLINE_LIMIT

    def _realize_scalar(self, v: TensorValue, e: ir.Expr) -> TensorValue:
        """SCALAR_LIMIT: stored once; computed first in the program when it reads only graph
        inputs (an optimizer's bias corrections), so that the updates reading it can still join
        the kernels that make their gradients (stored where it stands, it kept them waiting)."""
        out = self.realize(v)
        last = self.g.steps[-1] if self.g.steps else None
        if isinstance(last, ComputeNode) and out.view is not None and last.name == out.view.buf \
                and all(self.g.buffers[x.buf].kind == "input" for x in ir.loads(e)):
            self.g.steps.pop()
            last.region = 0  # depends on nothing a recompute region makes
            self.g.steps.insert(0, last)
        return out

    def _store_narrow(self, node: fx.Node, v: TensorValue) -> Optional[TensorValue]:
        """A float32 copy of a bfloat16/float16 value computed here (the upcast a bf16 norm
        backward starts with): store the 16-bit value and widen it at each load. Widening is
        exact, so the users read the same numbers at half the bytes, and the kernel storing it
        writes half."""
        from trainc.codegen.lowerings.common import LOW, cast
        src = node.args[0] if node.target is aten._to_copy.default else None
        u = self.env.get(src) if isinstance(src, fx.Node) else None
        if not isinstance(u, TensorValue) or u.view is not None or u.dtype not in LOW or \
                v.dtype != torch.float32 or u.shape != v.shape:
            return None
        stored = self.env[src] = self.realize(u)
        return TensorValue(v.shape, v.dtype, lambda i: cast(stored(i), torch.float32))

    def _output(self, a) -> Any:
        v = self._env(a) if isinstance(a, fx.Node) else a
        if not isinstance(v, TensorValue):
            return v
        if v.view is None:
            v = self._realize_as_traced(v, a)
        flat = _expanded_dims(a, v)
        if flat and any(v.view.stride[d] != 0 for d in flat):
            # Already stored densely (an extern read it): its slices along the traced stride-0
            # dims are equal, so the traced expanded layout is a view of the first one.
            stride = tuple(0 if d in flat else st for d, st in enumerate(v.view.stride))
            v = ir.buffer_value(v.view.buf, v.shape, stride, v.dtype, v.view.offset)
        return self.tensor_arg(v)

    def _realize_as_traced(self, v: TensorValue, node) -> TensorValue:
        """A computed output in the layout the traced graph gives it: a dense one as is; an
        expanded one (stride 0 on a longer dim) computed once along those dims and returned
        expanded. The next graph (a backward reading a saved value) indexes exactly that."""
        flat = _expanded_dims(node, v)
        if not flat:
            return self.realize(v, _traced_layout(node, v))
        shape = tuple(1 if d in flat else n for d, n in enumerate(v.shape))
        zero = ir.sympy.Integer(0)
        one = self.realize(TensorValue(shape, v.dtype, lambda i: v(
            [zero if d in flat else x for d, x in enumerate(i)])))
        stride = tuple(0 if d in flat else st for d, st in enumerate(one.view.stride))
        return ir.buffer_value(one.view.buf, v.shape, stride, v.dtype)


def _expanded_dims(node, v: TensorValue) -> list[int]:
    """The dims (longer than 1) on which the traced graph gives output `node` stride 0."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or tuple(val.shape) != v.shape:
        return []
    return [d for d, (n, st) in enumerate(zip(v.shape, val.stride())) if n > 1 and st == 0]


def _is_output(node: fx.Node) -> bool:
    return any(u.op == "output" for u in node.users)


def _stored_anyway(node: fx.Node, v: TensorValue) -> bool:
    """A graph output (a saved activation) that other nodes read too: it is stored either way,
    so its readers load it. Inlined, a residual stream's sum was recomputed by every later
    layer from all the branch outputs before it, each kept alive for that."""
    return len(node.users) > 1 and _is_output(node) and math.prod(v.shape) > 1 and \
        not _expanded_dims(node, v)


def _broadcast_and_costly(node: fx.Node, v: TensorValue, e: ir.Expr) -> bool:
    """BROADCAST_LIMIT: a multi-element value with a transcendental whose readers are larger."""
    n = math.prod(v.shape)
    if n <= 1 or not any(isinstance(x, ir.Op) and x.name in ir.TRANSCENDENTAL
                         for x in ir.walk(e)):
        return False
    return _largest_reader(node) >= BROADCAST_LIMIT * n


def _largest_reader(node: fx.Node, depth: int = 4) -> int:
    """The most elements of any non-view node reading `node`, looking through views."""
    most = 0
    for u in node.users:
        if u.op != "call_function":
            continue
        if u.target in functional.VIEW_OPS and depth > 0:
            most = max(most, _largest_reader(u, depth - 1))
            continue
        val = u.meta.get("val")
        if isinstance(val, torch.Tensor):
            most = max(most, val.numel())
    return most


def _extern_readers(node: fx.Node, is_extern: Callable, depth: int = 4) -> int:
    """Readers of `node` (through views) that are ATen calls: inlined, the value is stored once
    for each of them (a gradient read by two matmuls, one of them through a transpose, was
    stored twice, once as a transposing copy)."""
    count = 0
    for u in node.users:
        if u.op != "call_function":
            continue
        if u.target in functional.VIEW_OPS and depth > 0:
            count += _extern_readers(u, is_extern, depth - 1)
        elif isinstance(u.target, torch._ops.OpOverload) and is_extern(u.target):
            count += 1
    return count


def _crosses(node: fx.Node) -> bool:
    """Is a forward value read by the backward (compile_step with a budget, which tags forward
    nodes 0)? It is then stored where the partitioner put it: inlined into a backward kernel, it
    would keep its own inputs alive until there (the backward would hold x, not gelu'(x))."""
    return node.meta.get("trainc_region") == 0 and \
        any(u.meta.get("trainc_region", 0) != 0 for u in node.users)


_getitem = __import__("operator").getitem
aten = torch.ops.aten
CONVOLUTIONS = (aten.convolution.default, aten.convolution_backward.default)
# The memory-efficient attention kernels' bias (op -> its argument): strides in multiples of 16
# bytes (BIAS_ALIGN elements covers every dtype), or they raise "attn_bias is not correctly
# aligned"
EFFICIENT_ATTENTION = {aten._scaled_dot_product_efficient_attention.default: 3,
                       aten._scaled_dot_product_efficient_attention_backward.default: 4}
BIAS_ALIGN = 16
# A convolution backward computing both gradients is split in two calls when its input is at
# least this large: where the input is not read later, it is freed before grad_input exists.
# (Else the peak holds the input, the new grad_input and cuDNN's workspace at once.) Smaller
# ones stay one call (one launch less); a large input read later costs the extra call and
# saves nothing.
SPLIT_CONV_BACKWARD_BYTES = 64 << 20


def conv_weight(node: fx.Node) -> Optional[torch.Tensor]:
    """The traced weight of a convolution or convolution backward node."""
    w = node.args[1 if node.target is aten.convolution.default else 2].meta.get("val")
    return w if isinstance(w, torch.Tensor) else None


def _split_backward(args: tuple) -> bool:
    if len(args) != 11:  # all positional, as traced
        return False
    g, x, w, _, stride, padding, dilation, transposed, _, _, mask = args
    if transposed or not all(isinstance(v, TensorValue) for v in (g, x, w)):
        return False
    if not (isinstance(mask, (list, tuple)) and mask[0] and mask[1]):
        return False
    if not all(isinstance(v, (list, tuple)) and len(v) == len(x.shape) - 2
               for v in (stride, padding, dilation)):
        return False
    return math.prod(x.shape) * x.dtype.itemsize >= SPLIT_CONV_BACKWARD_BYTES


def _channels_last(shape) -> tuple[int, ...]:
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _memory_order(shape, stride) -> Optional[list[int]]:
    """The dims from outermost to innermost in memory for a dense layout that is not row-major
    (size-1 dims aside); None for row-major or non-dense layouts (and no `stride`)."""
    if stride is None or not is_dense(shape, stride):
        return None
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    big = [d for d in order if shape[d] != 1]
    return None if big == sorted(big) else order

_LOW = (torch.bfloat16, torch.float16)


def _rounded(v: TensorValue) -> TensorValue:
    """A low-precision node result rounded to its dtype, as eager rounds every op's output.
    Lowerings compute bf16/fp16 in float32; without this a value inlined into one consumer
    differs from the same value stored and reloaded by another (amax backward's x == max)."""
    if v.dtype not in _LOW or v.view is not None:
        return v
    fn, dt = v.fn, v.dtype

    def rounded(i):
        e = fn(i)
        exact = isinstance(e, ir.Load) and e.dtype == dt or \
            isinstance(e, ir.Op) and e.name == "cast" and e.dtype == dt
        return e if exact else ir.op("cast", dt, e)
    return TensorValue(v.shape, dt, rounded)


def _traced_layout(node, v: TensorValue) -> Optional[tuple[int, ...]]:
    """The dense, non-contiguous layout the traced graph gives an output (a saved transposed
    value, ...): computing it in that layout spares the consumer (the backward graph's input
    check, the runtime's eager-layout outputs) a copy. None: contiguous."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or tuple(val.shape) != tuple(v.shape):
        return None
    stride = tuple(int(s) for s in val.stride())
    if val.numel() <= 1 or stride == ir.contiguous_strides(v.shape) or \
            not is_dense(v.shape, stride):
        return None
    return stride


def _flat(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _map_all(f: Callable, x):
    """f applied to every leaf of nested lists/tuples."""
    if isinstance(x, (list, tuple)):
        return type(x)(_map_all(f, y) for y in x)
    return f(x)


def _map(f: Callable, x):
    return _map_all(lambda a: f(a) if isinstance(a, (fx.Node, TensorValue)) else a, x)


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def lower(gm: fx.GraphModule, lowerings: dict, is_extern: Callable,
          channels_last: Union[bool, Callable[[fx.Node], bool]] = False,
          store_scalars: bool = False, aten_nodes=frozenset()) -> LoweredGraph:
    return GraphLowering(gm, channels_last, store_scalars, frozenset(aten_nodes)).run(
        lowerings, is_extern)
