"""compile_step and optimizer step hooks: refused by default (eager runs them between backward
and update, a point the one-graph step does not have); optimizer_hooks="run" calls them around
the compiled step, in eager's order, and pre-hook changes to hyperparameters take effect."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)

import trainc


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def _ce(model, x, y):
    return F.cross_entropy(model(x), y)


def _batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


@pytest.mark.parametrize("where", ["pre", "post", "global_pre", "global_post"])
def test_registered_hooks_are_refused_by_default(where):
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    step = trainc.compile_step(m, _ce, opt, backend="aten")
    step(*_batch(0))  # no hooks yet: runs
    register = {"pre": opt.register_step_pre_hook, "post": opt.register_step_post_hook,
                "global_pre": register_optimizer_step_pre_hook,
                "global_post": register_optimizer_step_post_hook}[where]

    def my_hook(o, args, kwargs):
        return None
    handle = register(my_hook)
    try:
        w = m[0].weight.detach().clone()
        with pytest.raises(trainc.UnsupportedError, match="step hooks are registered.*my_hook"):
            step(*_batch(1))
        assert torch.equal(m[0].weight, w), "a refused step must not update anything"
        step(*_batch(1), accumulate=True)  # eager accumulation calls no optimizer.step()
    finally:
        handle.remove()
    step(*_batch(2))


def _hooked(opt, log):
    """A warm-up pre-hook (sets lr) and post-hooks that record what they see, as eager does."""
    def warmup(o, args, kwargs):
        log.append(("pre", o.param_groups[0]["lr"]))
        o.param_groups[0]["lr"] = 0.05 * (1 + len([e for e in log if e[0] == "pre"]))

    def record(o, args, kwargs):
        log.append(("post", o.param_groups[0]["params"][0].detach().clone()))

    def record_global(o, args, kwargs):
        if o is opt:
            log.append(("global_post", len(log)))
    return [opt.register_step_pre_hook(warmup), opt.register_step_post_hook(record),
            register_optimizer_step_post_hook(record_global)]


def test_run_mode_calls_hooks_like_eager():
    me, mc = _model(), _model()
    oe = torch.optim.SGD(me.parameters(), lr=0.1, momentum=0.9)
    oc = torch.optim.SGD(mc.parameters(), lr=0.1, momentum=0.9)
    log_e, log_c = [], []
    handles = _hooked(oe, log_e) + _hooked(oc, log_c)
    step = trainc.compile_step(mc, _ce, oc, backend="aten", optimizer_hooks="run")
    try:
        for i in range(4):
            x, y = _batch(i)
            _ce(me, x, y).backward()
            oe.step()
            oe.zero_grad(set_to_none=True)
            step(x, y)
    finally:
        for h in handles:
            h.remove()
    assert [e[0] for e in log_c] == [e[0] for e in log_e] == ["pre", "post", "global_post"] * 4
    for a, b in zip(log_c, log_e):
        if a[0] == "post":  # post-hooks see the updated parameters
            torch.testing.assert_close(a[1], b[1])
        else:
            assert a[1] == b[1]
    for a, b in zip(mc.parameters(), me.parameters()):  # the hook's lr changes were applied
        torch.testing.assert_close(a, b)
    assert step.compiles == 2, "a hook changing lr must not recompile"


def test_bad_hook_mode_and_argument_rewriting_pre_hook():
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="optimizer_hooks"):
        trainc.compile_step(m, _ce, opt, optimizer_hooks="ignore")
    step = trainc.compile_step(m, _ce, opt, backend="aten", optimizer_hooks="run")
    h = opt.register_step_pre_hook(lambda o, args, kwargs: (args + (None,), kwargs))
    try:
        with pytest.raises(trainc.UnsupportedError, match="new step.. arguments"):
            step(*_batch(0))
    finally:
        h.remove()
