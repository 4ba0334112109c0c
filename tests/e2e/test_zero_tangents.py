"""Backward variants for outputs nobody differentiated (runtime ZERO_TANGENT): a model
returning (loss, logits) with only the loss backpropagated runs no matmul for the logits'
gradient, matches eager under DESIGN.md's policy, and compiles its variant once."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import trainc
from policy import assert_policy
from trainc import chunked_loss, pipeline, runtime

V, D = 256, 16
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}


class LossAndLogits(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(V, D), nn.Linear(D, V)

    def forward(self, ids, tgt):
        logits = self.head(torch.tanh(self.emb(ids)))
        return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1)), logits


@pytest.fixture
def variants(monkeypatch):
    """Every zero-tangent variant's functional backward before and after folding."""
    monkeypatch.setattr(chunked_loss, "CHUNK_BYTES", 64 * V * 4)
    monkeypatch.setattr(runtime, "ZERO_TANGENT_EXPAND_BYTES", 0)
    made, real = [], pipeline._zero_tangent_backward

    def spy(functional, *args):
        made.append((_matmuls(functional), real(functional, *args)))
        return made[-1][1]
    monkeypatch.setattr(pipeline, "_zero_tangent_backward", spy)
    return made


def _matmuls(gm):
    return sum(n.target in MATMULS for n in gm.graph.nodes)


@pytest.mark.parametrize("backend", ["aten", "cpp"])
@pytest.mark.parametrize("chunk", [True, False])
def test_loss_only_backward_drops_the_logits_gradient(variants, backend, chunk):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    ids, tgt = (torch.randint(0, V, (4, 50), generator=g) for _ in range(2))
    m = LossAndLogits()
    e, r = copy.deepcopy(m), copy.deepcopy(m).double()
    c = trainc.compile(m, backend=backend, chunk_loss=chunk)
    for _ in range(3):
        for fn in (c, e, r):
            fn(ids, tgt)[0].backward()
        for name, p, q, s in zip(*zip(*m.named_parameters()), e.parameters(), r.parameters()):
            assert_policy(name, p.grad, q.grad, s.grad)
            p.grad = q.grad = s.grad = None
    assert len(variants) == 1  # compiled once, reused by the next steps
    traced, variant = variants[0]
    if chunk:  # the head's linear stays only for the returned logits: its 2 matmuls go
        assert traced == 2 and _matmuls(variant) == 0
    else:  # every matmul also carries the loss's gradient
        assert _matmuls(variant) == traced


def test_a_differentiated_logits_tangent_uses_the_traced_backward(variants):
    torch._dynamo.reset()
    ids = torch.randint(0, V, (4, 50))
    m = LossAndLogits()
    e = copy.deepcopy(m)
    c = trainc.compile(m, backend="aten", chunk_loss=True)
    for fn in (c, e):
        loss, logits = fn(ids, ids)
        (loss + logits.sin().mean()).backward()
    for p, q in zip(m.parameters(), e.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert variants == []
