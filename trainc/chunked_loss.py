"""An LM head's cross-entropy in row chunks, rewritten in the captured graph before tracing.

    loss = F.cross_entropy(linear(h, W, b) [.float() | .to(dtype)] [.view(-1, V)], target, ...)

becomes one call that runs, for the rows of h in chunks of about CHUNK_BYTES of float32 logits,
the chunk's logits, its loss and its gradients with respect to h, W and b (as Liger's fused
linear cross-entropy does), and whose backward only scales those gradients. The batch x seq x
vocab logits and their gradient then never exist whole, whatever the partitioner saves. The
linear itself stays where something else reads the logits (a model that returns them). Each
row's arithmetic is eager's (the same matmul row, log-softmax in the same dtype); the weight
gradient is summed over chunks in float32. `Config.chunk_loss` turns it on (default: when a
memory budget is set).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

# float32 logits per chunk; a loss gets chunked only when it would have at least MIN_CHUNKS
CHUNK_BYTES = 128 << 20
MIN_CHUNKS = 2
_LINEARS = (torch._C._nn.linear, F.linear)
_CE_KWARGS = {"weight": None, "size_average": None, "reduce": None, "label_smoothing": 0.0}


@dataclass(frozen=True)
class _Match:
    loss: fx.Node  # the cross_entropy call
    linear: fx.Node
    dtype: Optional[torch.dtype]  # the cast applied to the logits before the loss
    target: object
    ignore_index: int
    reduction: str
    rows: int  # rows per chunk


def rewrite(gm: fx.GraphModule) -> int:
    """Chunk every matching loss of gm in place (what gm computes is unchanged); the count."""
    matches = [m for n in gm.graph.nodes if (m := _match(n)) is not None]
    for m in matches:
        _replace(gm.graph, m)
    if matches:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return len(matches)


def _match(ce: fx.Node) -> Optional[_Match]:
    if ce.op != "call_function" or ce.target is not F.cross_entropy or len(ce.args) != 2:
        return None
    kw = dict(ce.kwargs)
    ignore_index, reduction = kw.pop("ignore_index", -100), kw.pop("reduction", "mean")
    if any(kw.pop(k, v) != v for k, v in _CE_KWARGS.items()) or kw or \
            reduction not in ("mean", "sum") or not isinstance(ignore_index, int):
        return None
    node, dtype = ce.args[0], None
    while isinstance(node, fx.Node) and node.op == "call_method" and len(node.users) == 1:
        step = _cast(node) if node.target in ("float", "to") else \
            _flatten(node) if node.target in ("view", "reshape", "contiguous") else False
        if step is False:
            return None
        dtype = step if step is not None else dtype
        node = node.args[0]
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in _LINEARS):
        return None
    logits, x = _example(node), _example(ce.args[0])
    if logits is None or x is None or x.dim() != 2 or x.shape[-1] != logits.shape[-1] or \
            logits.dim() < 2 or not logits.dtype.is_floating_point:
        return None
    classes, rows = logits.shape[-1], logits.numel() // logits.shape[-1]
    per_chunk = max(64, CHUNK_BYTES // (4 * classes) // 64 * 64)
    if rows < MIN_CHUNKS * per_chunk:
        return None
    return _Match(ce, node, dtype, ce.args[1], ignore_index, reduction, per_chunk)


def _cast(node: fx.Node):
    """The dtype a `.float()` / `.to(dtype)` casts to; False for any other `.to`."""
    if node.target == "float" and len(node.args) == 1 and not node.kwargs:
        return torch.float32
    if len(node.args) == 2 and not node.kwargs and isinstance(node.args[1], torch.dtype):
        return node.args[1]
    return False


def _flatten(node: fx.Node):
    """None for a view/reshape to (-1, classes) or a `.contiguous()`; False otherwise."""
    if node.target == "contiguous":
        return None if len(node.args) == 1 and not node.kwargs else False
    x, out = _example(node.args[0]), _example(node)
    if x is None or out is None or node.kwargs or out.dim() != 2 or out.shape[-1] != x.shape[-1]:
        return False
    return None


def _example(node) -> Optional[torch.Tensor]:
    v = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _replace(g: fx.Graph, m: _Match) -> None:
    h, weight, bias = (tuple(m.linear.args) + (None,))[:3]
    with g.inserting_before(m.loss):
        loss = g.call_function(_chunked_cross_entropy, (h, weight, bias, m.target, m.dtype,
                                                        m.ignore_index, m.reduction, m.rows))
    m.loss.replace_all_uses_with(loss)
    g.erase_node(m.loss)


def _chunked_cross_entropy(h, weight, bias, target, dtype, ignore_index: int, reduction: str,
                           rows: int) -> torch.Tensor:
    h2 = h.reshape(-1, h.shape[-1])
    return _LinearCrossEntropy.apply(h2, weight, bias, target.reshape(-1), dtype, ignore_index,
                                     reduction, rows)


class _LinearCrossEntropy(torch.autograd.Function):
    """The loss and its gradients, one chunk of rows at a time, in the forward: no chunk's
    logits outlive it, so no order the backward is scheduled in can make them all live. The
    backward scales the stored gradients by the loss's."""

    @staticmethod
    def forward(ctx, h, weight, bias, target, dtype, ignore_index, reduction, rows):
        valid = target != ignore_index
        scale = 1 / valid.sum() if reduction == "mean" else torch.ones((), device=h.device)
        acc = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if bias is not None \
            else None
        grads_h, total = [], None
        for hc, tc, vc in zip(h.split(rows), target.split(rows), valid.split(rows)):
            z = F.linear(hc, weight, bias)
            z = z if dtype is None else z.to(dtype)
            lse = torch.logsumexp(z, -1)
            safe = torch.where(vc, tc, 0).unsqueeze(1)
            picked = z.gather(1, safe).squeeze(1)
            part = torch.where(vc, lse - picked, 0).sum()
            total = part if total is None else total + part
            g = torch.exp(z - lse.unsqueeze(1))
            g = g - (torch.arange(z.shape[1], device=z.device) == safe).to(g.dtype)
            g = (g * (vc.unsqueeze(1) * scale).to(g.dtype)).to(hc.dtype)
            grads_h.append(g @ weight)
            grad_w = grad_w + (g.t() @ hc).to(acc)
            if grad_b is not None:
                grad_b = grad_b + g.sum(0).to(acc)
        ctx.save_for_backward(torch.cat(grads_h), grad_w.to(weight.dtype),
                              grad_b.to(bias.dtype) if grad_b is not None else None)
        return (total * scale).to(dtype or h.dtype)

    @staticmethod
    def backward(ctx, grad):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        g = grad.to(grad_h.dtype)
        return (grad_h * g, grad_w * g.to(grad_w.dtype),
                grad_b * g.to(grad_b.dtype) if grad_b is not None else None,
                None, None, None, None, None)
