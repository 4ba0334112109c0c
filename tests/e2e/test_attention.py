"""Explicit softmax attention traced as scaled_dot_product_attention (trainc/attention.py)."""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import trainc
from trainc import attention
from trainc.testing import assert_grads_match

T = attention.CPU_MIN_SEQ  # shortest CPU sequence the rewrite applies to


class Attn(nn.Module):
    def __init__(self, d=32, heads=2, causal=True, p=0.0, variant="mul"):
        super().__init__()
        self.h, self.qkv, self.causal = heads, nn.Linear(d, 3 * d), causal
        self.p, self.variant = p, variant

    def forward(self, x):
        B, L, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, L, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        if self.variant == "div":
            att = q @ k.transpose(2, 3) / math.sqrt(k.size(-1))
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.causal:
            mask = torch.ones(L, L, device=x.device, dtype=torch.bool)
            mask = mask.triu() if self.variant == "triu" else mask.tril()
            att = att.masked_fill(~mask, float("-inf"))
        att = att.softmax(dim=1 if self.variant == "dim1" else -1)
        att = F.dropout(att, self.p, self.training)
        return (att @ v).transpose(1, 2).reshape(B, L, C)


def _x(L=T):
    return torch.randn(2, L, 32)


@pytest.mark.parametrize("backend", ["aten", "cpp", "triton"])
@pytest.mark.parametrize("causal,variant", [(True, "mul"), (False, "div")])
def test_attention_is_rewritten_and_matches_eager(backend, causal, variant):
    torch.manual_seed(0)
    m = Attn(causal=causal, variant=variant)
    x = _x().requires_grad_(True)
    e = trainc.explain(m, x, backend=backend)
    assert e.attention_rewrites == 1
    assert "scaled_dot_product_attention" in str(e)
    # the T x T scores are not saved (the attention op's output and logsumexp are)
    saved = [d.shape for d in e.saved_tensors]
    assert saved and all(list(s).count(T) < 2 for s in saved), saved
    assert (2, 2, T) in saved, saved  # the logsumexp of each row
    assert_grads_match(m, [x], backend=backend)


@pytest.mark.parametrize("variant,p,training,L", [
    ("triu", 0.0, True, T),  # another mask
    ("dim1", 0.0, True, T),  # softmax over the other axis
    ("mul", 0.3, True, T),  # dropout that drops: its mask is trainc's RNG, not the op's
    ("mul", 0.0, True, T // 2),  # a short CPU sequence: the fused explicit form is faster
])
def test_other_programs_are_left_as_written(variant, p, training, L):
    torch.manual_seed(0)
    m = Attn(variant=variant, p=p).train(training)
    x = _x(L).requires_grad_(True)
    assert trainc.explain(m, x, backend="aten").attention_rewrites == 0
    if p == 0.0:
        assert_grads_match(m, [x], backend="cpp")


def test_dropout_in_eval_is_rewritten_and_option_turns_it_off():
    m = Attn(p=0.3).eval()
    x = _x()
    assert trainc.explain(m, x, backend="aten").attention_rewrites == 1
    assert trainc.explain(m, x, backend="aten", fuse_attention=False).attention_rewrites == 0


def test_compile_step_rewrites_attention():
    torch.manual_seed(0)
    m = nn.Sequential(Attn(), nn.Linear(32, 4))
    ref = copy.deepcopy(m)
    x, y = _x(), torch.randint(0, 4, (2, T))
    loss_fn = lambda mod, x, y: F.cross_entropy(mod(x).flatten(0, 1), y.flatten())
    # SGD: the key bias's gradient is rounding noise (softmax ignores a per-row constant), which
    # Adam would scale up to lr-sized steps
    opt, ref_opt = (torch.optim.SGD(mm.parameters(), lr=0.1) for mm in (m, ref))
    step = trainc.compile_step(m, loss_fn, opt, backend="cpp")
    for i in range(3):
        with trainc.records.recording() as recs:
            loss = step(x, y)
        if i == 0:
            assert [r.attention_rewrites for r in recs] == [1]
        ref_loss = loss_fn(ref, x, y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-4, atol=1e-5)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
