"""scaled_dot_product_attention calls made cheaper in the captured graph, before tracing.

1. A constant causal mask becomes `is_causal=True`, a constant mask that masks nothing is
   dropped. Models that build their mask as a tensor while compiled (Hugging Face before 5.24
   never skips it under torch.compile) call `F.scaled_dot_product_attention(q, k, v,
   attn_mask=M)`, and SDPA then runs its masked kernels. When M depends on no graph input, its
   value is computed here once; when it is exactly the top-left causal mask (bool `tril`, or
   0 / -inf) for every batch and head, the call drops it for `is_causal=True`, and when it is
   all True (all 0.0) the call drops it: the same attention weights.
2. Repeated KV heads become `enable_gqa=True` in a call without a mask: `k[:, :, None]
   .expand(B, KV, R, S, D).reshape(B, KV * R, S, D)` (repeat_kv) is head h reading KV head
   h // R, which is what `enable_gqa` means, so the call reads k itself.

Not in compile_step, which traces without Dynamo on fake tensors (a mask's value is not known
there). `Config.sdpa_rewrite` turns both off; `explain()` reports the count (`sdpa_rewrites`).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

_SDPA = (torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention)
_POSITIONAL = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


def rewrite(gm: fx.GraphModule) -> int:
    """Rewrite gm's SDPA calls in place (what gm computes is unchanged); the count rewritten."""
    masks: dict[fx.Node, bool] = {}  # mask node -> it is the causal mask (shared by layers)
    count = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _SDPA:
            done = _causal(gm, node, masks)
            count += bool(_gqa(node) or done)
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count


def _arguments(node: fx.Node) -> dict:
    return {**dict(zip(_POSITIONAL, node.args)), **node.kwargs}


def _set(node: fx.Node, **changes) -> None:
    args = {**_arguments(node), **changes}
    node.args = tuple(args.pop(name) for name in _POSITIONAL[:3])
    node.kwargs = args


def _causal(gm: fx.GraphModule, node: fx.Node, masks: dict) -> bool:
    args = _arguments(node)
    mask = args.get("attn_mask")
    if not isinstance(mask, fx.Node) or args.get("is_causal", False):
        return False
    if mask not in masks:
        masks[mask] = mask_kind(_constant_value(gm, mask), _example(args["query"]),
                                _example(args["key"]))
    if masks[mask] is None:
        return False
    _set(node, attn_mask=None, is_causal=masks[mask] == "causal")
    return True


def mask_kind(value, q, k) -> Optional[str]:
    """For a mask `value` of SDPA(q, k): "causal" where it is the top-left causal mask for every
    batch and head, "none" where it masks nothing (all True, or all 0.0), else None."""
    if q is None or k is None or not isinstance(value, torch.Tensor) or \
            isinstance(value, torch._subclasses.FakeTensor):
        return None
    if value.dim() > q.dim():
        return None
    shape = (*q.shape[:-1], k.shape[-2])  # the scores' shape, [..., L, S]
    try:
        if torch.broadcast_shapes(value.shape, shape) != torch.Size(shape):
            return None
    except RuntimeError:
        return None
    visible = value if value.dtype == torch.bool else value == 0 \
        if value.dtype.is_floating_point else None
    if visible is None or not (value.dtype == torch.bool or
                               bool((visible | (value == float("-inf"))).all())):
        return None  # a float bias other than 0 / -inf
    if bool(visible.all()):
        return "none"
    causal = torch.ones(shape[-2:], dtype=torch.bool, device=value.device).tril()
    if tuple(value.shape[-2:]) == shape[-2:] and bool((visible == causal).all()):
        return "causal"
    return None


def _constant_value(gm: fx.GraphModule, node: fx.Node):
    """The value `node` computes when nothing it reads is a graph input (else None); only its
    own ancestors run, on the devices the graph names."""
    order, seen, stack = [], set(), [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        if n.op in ("placeholder", "call_module") or _impure(n):
            return None
        seen.add(n)
        order.append(n)
        stack.extend(n.all_input_nodes)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in sorted(order, key=_position(gm)):
        env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(env[node])
    with torch.no_grad():
        return fx.GraphModule(gm, graph)()


def _impure(n: fx.Node) -> bool:
    """Random ops: their value now is not the value at run time."""
    target = getattr(n.target, "__name__", str(n.target))
    return any(word in target for word in ("rand", "dropout", "normal", "bernoulli", "seed"))


def _position(gm: fx.GraphModule):
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    return lambda n: index[n]


def _gqa(node: fx.Node) -> bool:
    args = _arguments(node)
    if args.get("enable_gqa", False) or args.get("attn_mask") is not None:
        return False  # with a mask, SDPA's GQA kernels are fewer (math on some devices)
    q = _example(args["query"])
    k0, v0 = _repeated(args["key"]), _repeated(args["value"])
    if q is None or k0 is None or v0 is None:
        return False
    k, v = _example(k0), _example(v0)
    if k is None or v is None or k.shape[:-3] != q.shape[:-3] or k.shape[-3] != v.shape[-3] \
            or q.shape[-3] % k.shape[-3]:
        return False
    _set(node, key=k0, value=v0, enable_gqa=True)
    return True


def _repeated(node) -> Optional[fx.Node]:
    """x where `node` is x[:, :, None].expand(B, KV, R, S, D).reshape(B, KV * R, S, D)."""
    if not (isinstance(node, fx.Node) and node.op == "call_method" and
            node.target in ("reshape", "view") and len(node.args) >= 2):
        return None
    expand = node.args[0]
    if not (isinstance(expand, fx.Node) and expand.op == "call_method" and
            expand.target == "expand"):
        return None
    index = expand.args[0]
    if not (isinstance(index, fx.Node) and index.op == "call_function" and
            getattr(index.target, "__name__", "") == "getitem" and
            index.args[1] == (slice(None), slice(None), None, slice(None), slice(None))):
        return None
    x, e, out = _example(index.args[0]), _example(expand), _example(node)
    if x is None or e is None or out is None or x.dim() != 4 or e.dim() != 5:
        return None
    b, kv, s, d = x.shape
    if tuple(e.shape) != (b, kv, e.shape[2], s, d) or \
            tuple(out.shape) != (b, kv * e.shape[2], s, d):
        return None
    return index.args[0]


def _example(node) -> Optional[torch.Tensor]:
    v = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None
