"""A second backward that adds parameter gradients into the existing `.grad` tensors in place.

Backward graph -> the same graph with one extra input per parameter gradient (its `.grad`),
each gradient output replaced by `grad + new`, written into that input (reinplace_ops). The
runtime uses it only when autograd would have done exactly that (`targets`), and then returns
no gradient for those parameters, so AccumulateGrad has nothing left to add.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.fx as fx

from trainc.codegen.graph import STORE_NOW
from trainc.graph import GraphSignature, InputKind, is_dense, nbytes, val
from trainc.passes import MUTABLE_INPUTS

aten = torch.ops.aten
# Parameter gradient bytes below which the second backward is not worth its fixed cost per call
# (its checks and version bumps; measured: BENCHMARKS.md, session 23 driver section).
MIN_BYTES = 1 << 20


@dataclass(frozen=True)
class AccumulatePlan:
    slots: tuple[int, ...]  # backward output slots (grad k of sig.grads) added into .grad
    inputs: tuple[int, ...]  # the graph input (a parameter) of each slot
    edges: tuple[int, ...]  # its position among the forward's tensor arguments (next_functions)
    strides: tuple[tuple[int, ...], ...]  # the layout the compiled graph adds into
    dtypes: tuple[torch.dtype, ...]


def plan_accumulation(bwd: fx.GraphModule, sig: GraphSignature, args: Sequence,
                      always: Optional[bool] = True) -> Optional[AccumulatePlan]:
    """Which gradient outputs can be added into their parameter's `.grad`: parameters given as
    dense tensors whose gradient is a dense tensor of the parameter's layout (unless `always`,
    None when they take fewer than MIN_BYTES together)."""
    outs = bwd.graph.output_node().args[0]
    tensor_pos, n = {}, 0
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            tensor_pos[i], n = n, n + 1
    chosen = []
    for k, i in enumerate(sig.grads):
        o, a = outs[k], args[i] if i < len(args) else None
        if sig.inputs[i].kind is not InputKind.PARAM or not isinstance(o, fx.Node) \
                or not isinstance(a, torch.Tensor) or not isinstance(val(o), torch.Tensor):
            continue
        v = val(o)
        if v.shape == a.shape and v.stride() == a.stride() and v.dtype == a.dtype \
                and is_dense(v.shape, v.stride()) and a.layout == torch.strided:
            chosen.append((k, i, tensor_pos[i], tuple(v.stride()), v.dtype))
    if not chosen or (not always and sum(nbytes(val(outs[c[0]])) for c in chosen) < MIN_BYTES):
        return None
    return AccumulatePlan(*(tuple(c[j] for c in chosen) for j in range(5)))


def accumulating_backward(bwd: fx.GraphModule, plan: AccumulatePlan) -> fx.GraphModule:
    """A copy of `bwd` taking the `.grad` tensors as extra inputs: slot k computes
    `grad_k + new_k` (right after new_k, while it is hot) and may write it into grad_k."""
    gm = fx.GraphModule(bwd, _copy_graph(bwd.graph))
    g = gm.graph
    out = g.output_node()
    results = list(out.args[0])
    last = [n for n in g.nodes if n.op == "placeholder"][-1]
    first_op = last.next
    mutable = {}
    for k in plan.slots:
        new = results[k]
        with g.inserting_after(last):
            acc = last = g.placeholder(f"grad_into_{k}")
        acc.meta["val"] = val(new)
        factors = _product(new, out)
        if factors is not None:  # the library adds the product into .grad itself (beta=1)
            with g.inserting_after(new):
                total = g.call_function(aten.addmm_.default, (acc, *factors))
            total.meta["val"] = val(new)
            results[k] = total
            out.args = (type(out.args[0])(results),)
            while new.op == "call_function" and not new.users:
                new, dead = new.args[0], new
                g.erase_node(dead)
            continue
        anchor = new if new.op != "placeholder" else first_op.prev
        with g.inserting_after(anchor):
            total = g.call_function(aten.add.Tensor, (acc, new))
        total.meta.update(val=val(new), **{STORE_NOW: True})
        results[k] = total
        mutable[acc.name] = k
    out.args = (type(out.args[0])(results),)
    gm.meta[MUTABLE_INPUTS] = mutable
    g.lint()
    gm.recompile()
    return gm


def _product(node: fx.Node, out: fx.Node) -> Optional[tuple]:
    """(a, b) when `node`, returned once and read by nothing else, is mm(a, b) or a transpose
    of one ((a @ b)^T = b^T @ a^T, as permute nodes on b and a), each link read only there."""
    if list(node.users) != [out] or sum(a is node for a in out.args[0]) != 1:
        return None
    flip = False
    while node.target is aten.permute.default and len(node.args[0].users) == 1:
        flip ^= list(node.args[1]) == [1, 0]
        node = node.args[0]
    if node.op != "call_function" or node.target is not aten.mm.default:
        return None
    a, b = node.args
    if not flip:
        return a, b
    g = node.graph
    with g.inserting_before(node):
        bt, at = (g.call_function(aten.permute.default, (x, [1, 0])) for x in (b, a))
    for t, x in ((bt, b), (at, a)):
        t.meta["val"] = val(x).permute(1, 0)
    return bt, at


def _copy_graph(graph: fx.Graph) -> fx.Graph:
    new = fx.Graph()
    env: dict = {}
    out = new.graph_copy(graph, env)
    new.output(out)
    return new


def targets(ctx, plan: AccumulatePlan, params: Sequence[torch.Tensor],
            inputs: Sequence[torch.Tensor]) -> Optional[list[torch.Tensor]]:
    """The `.grad` tensors to add into, or None when autograd would not do exactly that for
    every planned parameter: its AccumulateGrad node runs in this backward (not torch.autograd.
    grad, not excluded by backward(inputs=...)), it has no tensor hooks (they would see the
    gradient), `.grad` exists (else autograd adopts the new tensor), is a plain dense tensor of
    the compiled layout without autograd history, and shares memory with no other target and
    no tensor the backward reads (`inputs`)."""
    nexts = ctx.next_functions
    grads, ptrs = [], set()
    for p, e, stride, dtype in zip(params, plan.edges, plan.strides, plan.dtypes):
        g = p.grad
        if g is None or type(g) is not torch.Tensor or g.layout != torch.strided \
                or g.requires_grad or g.dtype != dtype or g.stride() != stride \
                or p._backward_hooks or not _will_run(nexts[e][0], p):
            return None
        grads.append(g)
        ptrs.add(g.untyped_storage().data_ptr())
    if len(ptrs) != len(grads):
        return None
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in ptrs:
            return None
    return grads


_ACCUMULATE_GRAD = torch._C._functions.AccumulateGrad


def _will_run(node, p: torch.Tensor) -> bool:
    if type(node) is not _ACCUMULATE_GRAD or node.variable is not p:
        return False
    try:
        return torch._C._will_engine_execute_node(node)
    except RuntimeError:  # torch.autograd.grad: leaves are captured, never accumulated
        return False
