"""Save policies: which ops the partitioner may recompute in the backward, as small frozen rules.

In the spirit of JAX's checkpoint policies: `classify(node)` names the op's class; the class
decides whether recomputing it is allowed by default, only under a memory budget, or never.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from trainc.graph import val

# Op classes. "view"/"cheap"/"reduction"/"random" are recomputed freely; "expensive" only when a
# memory budget demands it; "never" is always saved (unknown or impure ops: correctness first).
VIEW, CHEAP, REDUCTION, RANDOM, EXPENSIVE, NEVER, INPUT = (
    "view", "cheap", "reduction", "random", "expensive", "never", "input")

DEFAULT_EXPENSIVE = frozenset({
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.convolution",
    "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_attention_math",
    "aten._scaled_dot_product_flash_attention_for_cpu",
})

VIEW_OPS = frozenset({
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten.permute", "aten.expand", "aten.t",
    "aten.transpose", "aten.unsqueeze", "aten.squeeze", "aten.slice", "aten.select",
    "aten.split", "aten.split_with_sizes", "aten.unbind", "aten.as_strided", "aten.alias",
    "aten.detach", "aten.diagonal", "aten.narrow", "aten.view_as_real", "aten.view_as_complex",
})

REDUCTION_OPS = frozenset({
    "aten.sum", "aten.mean", "aten.amax", "aten.amin", "aten.max", "aten.min", "aten.prod",
    "aten.var", "aten.var_mean", "aten.std", "aten._softmax", "aten._log_softmax",
    "aten.native_layer_norm", "aten.logsumexp", "aten.argmax", "aten.argmin", "aten.any",
    "aten.all", "aten.norm", "aten.linalg_vector_norm", "aten.cumsum",
    "aten._native_batch_norm_legit_functional", "aten._native_batch_norm_legit",
    "aten.native_batch_norm",
})

RANDOM_OPS = frozenset({"trainc.philox_uniform"})


def op_name(node: fx.Node) -> str:
    """'aten.mm' for aten.mm.default: policies match on overload packets."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}"
    return getattr(target, "__name__", str(target))


@dataclass(frozen=True)
class SavePolicy:
    """Which ops are expensive (saved unless a budget forces recompute) and which never recompute.

    Pass your own through `trainc.compile(..., policy=SavePolicy(...))`.
    """
    expensive: frozenset = field(default=DEFAULT_EXPENSIVE)
    never: frozenset = frozenset()
    # A reduction that folds more than this many inputs into each output counts as expensive:
    # recomputing it rereads a large tensor to rebuild a small one.
    max_cheap_reduction: int = 8192
    recompute_random: bool = True  # philox ops are pure functions of (seed, offset)
    # Roofline of the recompute-cost estimate: flops per byte moved at which an op turns
    # compute-bound. Recompute cost = max(flops / flops_per_byte, bytes written).
    flops_per_byte: float = 32.0

    def classify(self, node: fx.Node) -> str:
        if node.op in ("placeholder", "get_attr"):  # graph inputs and tensor constants
            return INPUT
        name = op_name(node)
        if name in self.never:
            return NEVER
        if name in self.expensive:
            return EXPENSIVE
        if node.target is operator.getitem or name in VIEW_OPS:
            return VIEW
        if name in RANDOM_OPS:
            return RANDOM if self.recompute_random else NEVER
        if not isinstance(node.target, torch._ops.OpOverload):
            return NEVER
        if name in REDUCTION_OPS:
            return REDUCTION if _reduction_extent(node) <= self.max_cheap_reduction else EXPENSIVE
        return CHEAP

    def recomputable(self, node: fx.Node, under_budget: bool) -> bool:
        cls = self.classify(node)
        if cls in (NEVER, INPUT):
            return False
        return under_budget or cls != EXPENSIVE


def _reduction_extent(node: fx.Node) -> int:
    """How many input elements fold into one output element."""
    ins = [val(a) for a in node.all_input_nodes]
    in_numel = max((int(v.numel()) for v in ins if isinstance(v, torch.Tensor)), default=1)
    out = val(node)
    outs = out if isinstance(out, (list, tuple)) else [out]
    out_numel = min((int(v.numel()) for v in outs if isinstance(v, torch.Tensor)
                     and v.numel() > 0), default=1)
    return in_numel // max(out_numel, 1)


DEFAULT_POLICY = SavePolicy()
# JAX-like presets: save only matmul/conv/attention outputs (the default), or save nothing.
DOTS_SAVEABLE = DEFAULT_POLICY
NOTHING_SAVEABLE = SavePolicy(expensive=frozenset(), max_cheap_reduction=2**62)
