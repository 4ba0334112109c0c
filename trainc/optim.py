"""Optimizer update rules trainc traces into a whole-step graph, keyed by optimizer class.

Each rule updates parameters and state tensors in place, as torch.optim does; functionalization
turns those writes into graph outputs. Scalars schedulers change (lr, betas, ...) arrive as 0-d
tensors, so a new value never recompiles; only structural flags (momentum on/off, ...) do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from trainc.joint import UnsupportedError

Tensor = torch.Tensor


@dataclass(frozen=True)
class Rule:
    hyper: tuple[str, ...]  # per-group scalars passed as graph inputs
    state: Callable[[dict], tuple[str, ...]]  # state tensor names for one parameter, from group
    flags: Callable[[dict], tuple]  # structural choices baked into the graph
    init: Callable[[dict, Tensor], dict]  # fresh state for one parameter
    update: Callable  # (params, grads, states, hyper: dict[str, Tensor], flags, fresh) -> None
    fresh_matters: bool  # the first update of a parameter differs (SGD's momentum buffer)
    # state counters the runtime advances on the host after each update (Adam's step, a CPU
    # scalar): the graph reads them, +1, and never writes them, so a CUDA step never copies
    # a result back to the CPU (a synchronization per parameter)
    host_counters: tuple[str, ...] = ()


def _sgd_state(group: dict) -> tuple[str, ...]:
    return ("momentum_buffer",) if group["momentum"] != 0 else ()


def _sgd_flags(group: dict) -> tuple:
    return (group["momentum"] != 0, group["nesterov"], group["weight_decay"] != 0,
            group["maximize"])


def _sgd_init(group: dict, p: Tensor) -> dict:
    return {"momentum_buffer": torch.zeros_like(p)} if group["momentum"] != 0 else {}


def _sgd_update(params, grads, states, h, flags, fresh) -> None:
    has_momentum, nesterov, has_wd, maximize = flags
    for p, g, st, new in zip(params, grads, states, fresh):
        g = -g if maximize else g
        if has_wd:
            g = g + p * h["weight_decay"]
        if has_momentum:
            buf = st["momentum_buffer"]
            if new:  # torch.optim starts the buffer as a copy of the first gradient
                buf.copy_(g)
            else:
                buf.mul_(h["momentum"]).add_(g * (1 - h["dampening"]))
            g = g + buf * h["momentum"] if nesterov else buf
        p.sub_(g * h["lr"])


def _adam_state(group: dict) -> tuple[str, ...]:
    return ("step", "exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())


def _adam_flags(group: dict) -> tuple:
    return (group["weight_decay"] != 0, group["amsgrad"], group["maximize"],
            bool(group.get("decoupled_weight_decay", False)))


def _adam_init(group: dict, p: Tensor) -> dict:
    st = {"step": torch.tensor(0.0, dtype=torch.get_default_dtype()),
          "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
          "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
    if group["amsgrad"]:
        st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return st


def _adam_update(params, grads, states, h, flags, fresh) -> None:
    has_wd, amsgrad, maximize, decoupled = flags
    for p, g, st in zip(params, grads, states):
        g = -g if maximize else g
        step = st["step"] + 1  # st["step"] itself is advanced on the host (Rule.host_counters)
        if has_wd and decoupled:
            p.mul_(1 - h["lr"] * h["weight_decay"])
        elif has_wd:
            g = g + p * h["weight_decay"]
        st["exp_avg"].lerp_(g, (1 - h["beta1"]).to(g.dtype))
        st["exp_avg_sq"].mul_(h["beta2"]).add_(g * g * (1 - h["beta2"]))
        # Bias corrections in float64 on the CPU scalar, as torch.optim does them in Python.
        step = step.to(torch.float64)
        step_size = h["lr"] / (1 - h["beta1"] ** step)
        bc2_sqrt = (1 - h["beta2"] ** step).sqrt()
        second = st["exp_avg_sq"]
        if amsgrad:
            st["max_exp_avg_sq"].copy_(torch.maximum(st["max_exp_avg_sq"], second))
            second = st["max_exp_avg_sq"]
        denom = second.sqrt() / bc2_sqrt + h["eps"]
        p.sub_(st["exp_avg"] / denom * step_size)


_SGD = Rule(("lr", "momentum", "dampening", "weight_decay"), _sgd_state, _sgd_flags, _sgd_init,
            _sgd_update, fresh_matters=True)
_ADAM = Rule(("lr", "beta1", "beta2", "eps", "weight_decay"), _adam_state, _adam_flags,
             _adam_init, _adam_update, fresh_matters=False, host_counters=("step",))

RULES: dict[type, Rule] = {torch.optim.SGD: _SGD, torch.optim.Adam: _ADAM,
                           torch.optim.AdamW: _ADAM}


def rule_for(optimizer: torch.optim.Optimizer) -> Rule:
    rule = RULES.get(type(optimizer))
    if rule is None:
        raise NotImplementedError(
            f"trainc.compile_step: {type(optimizer).__name__} is not supported; supported "
            f"optimizers: {', '.join(c.__name__ for c in RULES)}")
    for group in optimizer.param_groups:
        for key in ("differentiable", "capturable", "fused"):
            if group.get(key):
                raise NotImplementedError(f"trainc.compile_step: {key}=True is not supported")
    return rule


def hyper_values(rule: Rule, group: dict) -> list[float]:
    """The group's scalars in `rule.hyper` order (betas split into beta1, beta2)."""
    values = dict(group)
    if "betas" in group:
        values["beta1"], values["beta2"] = group["betas"]
    return [float(values[k]) for k in rule.hyper]


HOOK_MODES = ("error", "run")


def step_hooks(optimizer: torch.optim.Optimizer) -> tuple[list, list]:
    """(pre, post) optimizer step hooks in the order eager `optimizer.step()` calls them."""
    from torch.optim import optimizer as O
    pre = list(O._global_optimizer_pre_hooks.values()) + \
        list(getattr(optimizer, "_optimizer_step_pre_hooks", {}).values())
    post = list(getattr(optimizer, "_optimizer_step_post_hooks", {}).values()) + \
        list(O._global_optimizer_post_hooks.values())
    return pre, post


def run_pre_hooks(optimizer: torch.optim.Optimizer, mode: str) -> list:
    """Before the compiled step. "error": refuse registered hooks (eager runs them between
    backward and update, where the whole-step graph has no seam: they would not see .grad);
    "run": call them now, with .grad None. Returns the post hooks to call afterwards."""
    pre, post = step_hooks(optimizer)
    if not (pre or post):
        return []
    if mode == "error":
        names = ", ".join(getattr(h, "__name__", type(h).__name__) for h in pre + post)
        raise UnsupportedError(
            f"trainc.compile_step: optimizer step hooks are registered ({names}). Eager calls "
            "them after backward, before/after the update, with gradients in .grad; the "
            "compiled step has no such point. Remove them, or pass optimizer_hooks='run' to "
            "call them before/after the whole compiled step (with .grad None).")
    args: tuple = (optimizer,)
    for hook in pre:
        result = hook(optimizer, args, {})
        if result is not None and (not isinstance(result, tuple) or len(result) != 2
                                   or len(result[0]) != 1 or result[1]):
            raise UnsupportedError("trainc.compile_step: an optimizer step pre-hook returned "
                                   "new step() arguments; the compiled step takes none")
    return post


def run_post_hooks(optimizer: torch.optim.Optimizer, post: list) -> None:
    for hook in post:
        hook(optimizer, (optimizer,), {})
