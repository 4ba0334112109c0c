"""An LM head's cross-entropy in row chunks, rewritten in the captured graph before tracing.

    loss = F.cross_entropy(linear(h, W, b) [.float() | .to(dtype)] [.view(-1, V)], target, ...)

becomes one call that runs, for the rows of h in chunks of about CHUNK_BYTES of float32 logits,
the chunk's logits, its loss and its gradients with respect to h, W and b (as Liger's fused
linear cross-entropy does), and whose backward only scales those gradients. The batch x seq x
vocab logits and their gradient then never exist whole, whatever the partitioner saves. The
linear itself stays where something else reads the logits (a model that returns them). Each
row's arithmetic is eager's (the same matmul row, log-softmax in the same dtype); the weight
gradient is summed over chunks in float32. `Config.chunk_loss` turns it on (default: when a
memory budget is set). compile_step traces without Dynamo: `tracing()` matches the same
pattern on live calls there.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

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
    if ce.op != "call_function" or ce.target is not F.cross_entropy:
        return None
    options = _loss_options(ce.args, ce.kwargs)
    if options is None:
        return None
    ignore_index, reduction = options
    node, dtype = ce.args[0], None  # walk back from the loss's input to the linear
    while isinstance(node, fx.Node) and node.op == "call_method" and len(node.users) == 1:
        step = _cast(node) if node.target in ("float", "to") else \
            _flatten(node) if node.target in ("view", "reshape", "contiguous") else False
        if step is False:
            return None
        dtype = step if step is not None else dtype
        node = node.args[0]
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in _LINEARS):
        return None
    per_chunk = _rows_per_chunk(_example(node), _example(ce.args[0]))
    if per_chunk is None:
        return None
    return _Match(ce, node, dtype, ce.args[1], ignore_index, reduction, per_chunk)


def _loss_options(args: tuple, kwargs: dict) -> Optional[tuple[int, str]]:
    """(ignore_index, reduction) of a cross_entropy(input, target, ...) call that chunking
    computes exactly; None for any other option."""
    if len(args) != 2:
        return None
    kw = dict(kwargs)
    ignore_index, reduction = kw.pop("ignore_index", -100), kw.pop("reduction", "mean")
    if any(kw.pop(k, v) != v for k, v in _CE_KWARGS.items()) or kw or \
            reduction not in ("mean", "sum") or not isinstance(ignore_index, int):
        return None
    return ignore_index, reduction


def _rows_per_chunk(logits, x) -> Optional[int]:
    """Rows per chunk for these logits fed to the loss as x (rows x classes); None when the
    shapes do not fit the pattern or the logits are too small to chunk."""
    if not isinstance(logits, torch.Tensor) or not isinstance(x, torch.Tensor) or \
            x.dim() != 2 or x.shape[-1] != logits.shape[-1] or logits.dim() < 2 or \
            not logits.dtype.is_floating_point:
        return None
    classes, rows = logits.shape[-1], logits.numel() // logits.shape[-1]
    per_chunk = max(64, CHUNK_BYTES // (4 * classes) // 64 * 64)
    return per_chunk if rows >= MIN_CHUNKS * per_chunk else None


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


class _Chunking(TorchFunctionMode):
    """The pattern on live calls: a tensor F.linear made, and its .float() / .to(dtype) /
    .view / .reshape / .contiguous(), remember (logits, h, weight, bias, cast); cross_entropy
    of one runs _chunked_cross_entropy instead. The linear stays if something reads it."""

    def __init__(self):
        super().__init__()
        self.tags: dict[int, tuple] = {}  # id -> (tensor kept alive, its tag)
        self.rewrites = 0

    def tag(self, t) -> Optional[tuple]:
        hit = self.tags.get(id(t)) if isinstance(t, torch.Tensor) else None
        return hit[1] if hit is not None and hit[0] is t else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.cross_entropy:
            out = self._loss(args, kwargs)
            if out is not None:
                self.rewrites += 1
                return out
        out = func(*args, **kwargs)
        tag = self._follow(func, out, args, kwargs)
        if tag is not None and isinstance(out, torch.Tensor):
            self.tags[id(out)] = (out, tag)
        return out

    def _follow(self, func, out, args, kwargs) -> Optional[tuple]:
        if func in _LINEARS and len(args) >= 2:
            return (out, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("bias"),
                    None)
        tag, name = self.tag(args[0]) if args else None, getattr(func, "__name__", "")
        if tag is None:
            return None
        if name in ("float", "to"):
            dtype = _cast_of(args, kwargs, name)
            return tag[:4] + (dtype,) if dtype is not None else None
        if name == "contiguous" and len(args) == 1 and not kwargs:
            return tag
        if name in ("view", "reshape") and isinstance(out, torch.Tensor) and out.dim() == 2 \
                and out.shape[-1] == args[0].shape[-1]:
            return tag
        return None

    def _loss(self, args, kwargs) -> Optional[torch.Tensor]:
        options, tag = _loss_options(args, kwargs), self.tag(args[0]) if args else None
        if options is None or tag is None:
            return None
        logits, h, weight, bias, dtype = tag
        rows = _rows_per_chunk(logits, args[0])
        if rows is None:
            return None
        return _chunked_cross_entropy(h, weight, bias, args[1], dtype, *options, rows)


def _cast_of(args, kwargs, name) -> Optional[torch.dtype]:
    if name == "float":
        return torch.float32 if len(args) == 1 and not kwargs else None
    return args[1] if len(args) == 2 and not kwargs and isinstance(args[1], torch.dtype) \
        else None


@contextlib.contextmanager
def tracing(enabled: bool = True) -> Iterator[Optional[_Chunking]]:
    """Chunk the LM-head losses computed inside this block (compile_step's trace; None:
    disabled). The yielded mode's `rewrites` counts them."""
    if not enabled:
        yield None
        return
    mode = _Chunking()
    with mode:
        yield mode


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
