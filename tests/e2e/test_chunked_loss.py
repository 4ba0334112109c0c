"""The LM head's cross-entropy in row chunks (trainc/chunked_loss.py): same values as eager
under DESIGN.md's policy, the batch x seq x vocab logits never whole, rewritten only where the
pattern holds."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import trainc
from policy import assert_policy
from trainc import chunked_loss, partition, records
from trainc.config import make_config

V, D = 512, 32


class LM(nn.Module):
    """GPT-style (`logits.float().view(-1, V)`) or Hugging Face-style (logits returned too)."""

    def __init__(self, returns_logits=False, bias=False, cast=True, **ce):
        super().__init__()
        self.emb, self.head = nn.Embedding(V, D), nn.Linear(D, V, bias=bias)
        self.returns_logits, self.cast, self.ce = returns_logits, cast, ce

    def forward(self, ids, tgt):
        logits = self.head(torch.tanh(self.emb(ids)))
        x = logits.float() if self.cast else logits
        loss = F.cross_entropy(x.view(-1, V), tgt.view(-1), **self.ce)
        return (loss, logits) if self.returns_logits else loss


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(chunked_loss, "CHUNK_BYTES", 64 * V * 4)  # 64 rows a chunk


def _batch(rows=4 * 100, ignored=True, ignore_index=-100):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (4, rows // 4), generator=g)
    tgt = torch.randint(0, V, (4, rows // 4), generator=g)
    if ignored:
        tgt[:, :7] = ignore_index
    return ids, tgt


def _run(model, ids, tgt):
    for p in model.parameters():
        p.grad = None
    out = model(ids, tgt)
    loss = out[0] if isinstance(out, tuple) else out
    (loss + (out[1].float().sin().mean() if isinstance(out, tuple) else 0)).backward()
    return out, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("backend", ["aten", "cpp"])
@pytest.mark.parametrize("kw", [dict(), dict(returns_logits=True, bias=True),
                                dict(reduction="sum"), dict(cast=False, ignore_index=5)])
def test_values_match_eager_and_float64(backend, kw):
    torch._dynamo.reset()
    ids, tgt = _batch(ignore_index=kw.get("ignore_index", -100))
    model = LM(**kw)
    eager, ref = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled = trainc.compile(model, backend=backend, chunk_loss=True)
    got, got_grads = _run(compiled, ids, tgt)
    exp, exp_grads = _run(eager, ids, tgt)
    r, r_grads = _run(ref, ids, tgt)
    outs = zip(*(o if isinstance(o, tuple) else (o,) for o in (got, exp, r)))
    for i, (c, e, f) in enumerate(outs):
        assert_policy(f"output {i}", c.detach(), e.detach(), f.detach())
    for i, (c, e, f) in enumerate(zip(got_grads, exp_grads, r_grads)):
        assert_policy(f"grad {i}", c, e, f)
    assert trainc.explain(LM(**kw), ids, tgt, backend=backend, chunk_loss=True).chunked_losses == 1


def test_logits_never_whole_under_a_budget():
    ids, tgt = _batch(ignored=False)
    logits_bytes = ids.numel() * V * 4
    peaks = {}
    for chunk in (False, True):
        torch._dynamo.reset()
        fn = trainc.compile(LM(), memory_budget=0.0, chunk_loss=chunk)
        with partition.observing() as parts:
            fn(ids, tgt).backward()
        peaks[chunk] = max(p.memory.peak for p in parts)
    assert peaks[False] >= logits_bytes
    assert peaks[True] < logits_bytes / 2


@pytest.mark.parametrize("kw", [dict(label_smoothing=0.1), dict(weight=torch.ones(V))])
def test_other_losses_are_left_alone(kw):
    torch._dynamo.reset()
    ids, tgt = _batch(ignored=False)
    ex = trainc.explain(LM(**kw), ids, tgt, chunk_loss=True)
    assert ex.chunked_losses == 0


def test_small_logits_are_left_alone(monkeypatch):
    monkeypatch.setattr(chunked_loss, "CHUNK_BYTES", 1 << 30)
    torch._dynamo.reset()
    assert trainc.explain(LM(), *_batch(), chunk_loss=True).chunked_losses == 0


def test_on_by_default_only_under_a_budget():
    assert make_config().chunk_loss is False
    assert make_config(memory_budget=1.0).chunk_loss is False
    assert make_config(memory_budget=0.5).chunk_loss == "auto"
    assert make_config(memory_budget=1 << 30).chunk_loss == "auto"
    assert make_config(memory_budget=0.0, chunk_loss=False).chunk_loss is False


def _step_run(model, batches, compiled, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)

    def loss_fn(m, ids, tgt):
        out = m(ids, tgt)
        return out[0] if isinstance(out, tuple) else out
    if compiled:
        step = trainc.compile_step(model, loss_fn, opt, backend="aten", **kw)
    else:
        def step(*b):
            loss = loss_fn(model, *b)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
    return [step(*b) for b in batches], model.state_dict()


@pytest.mark.parametrize("kw", [dict(), dict(returns_logits=True, bias=True)])
def test_compile_step_chunks_the_loss(kw):
    """compile_step traces without Dynamo: chunked_loss.tracing matches on live calls."""
    batches = [_batch() for _ in range(3)]
    model = LM(**kw)
    ref = _step_run(copy.deepcopy(model).double(), batches, False)
    eager = _step_run(copy.deepcopy(model), batches, False)
    with records.recording() as recs:
        comp = _step_run(copy.deepcopy(model), batches, True, chunk_loss=True)
    assert [r.chunked_losses for r in recs] == [1]
    for i, (c, e, r) in enumerate(zip(comp[0], eager[0], ref[0])):
        assert_policy(f"loss step {i}", c, e, r)
    for k in ref[1]:
        assert_policy(k, comp[1][k], eager[1][k], ref[1][k])
    with records.recording() as recs:
        _step_run(copy.deepcopy(model), batches[:1], True, chunk_loss=False)
    assert [r.chunked_losses for r in recs] == [0]
