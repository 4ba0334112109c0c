"""SDPA calls rewritten in the captured graph (trainc/sdpa_rewrite.py): a constant causal mask
becomes is_causal, repeated KV heads become enable_gqa; anything else is left as written. Values
are checked against eager under DESIGN.md's policy."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import trainc
from trainc import records
from trainc.testing import assert_grads_match

B, H, KV, S, D = 2, 4, 2, 160, 16


def _mask(kind: str, s: int, batch: int = B) -> torch.Tensor:
    """Masks built the way models build them while compiled (Hugging Face's sdpa_mask)."""
    q, kv = torch.arange(s)[None, None, :, None], torch.arange(s)[None, None, None, :]
    if kind == "bool":
        return (kv <= q).expand(batch, -1, s, s)
    if kind == "float":
        return torch.zeros(s, s).masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(),
                                             float("-inf"))
    if kind == "ones":  # a padding mask without padding
        return torch.ones(batch, 1, s, s, dtype=torch.bool)
    if kind == "shifted":  # sees one position ahead: not SDPA's causal mask
        return (kv <= q + 1).expand(batch, -1, s, s)
    raise ValueError(kind)


class Attention(nn.Module):
    def __init__(self, mask=None, gqa=False):
        super().__init__()
        self.mask, self.gqa = mask, gqa
        self.q, self.kv = nn.Linear(D, H * D), nn.Linear(D, 2 * (KV if gqa else H) * D)

    def forward(self, x, attention_mask=None):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, H, D).transpose(1, 2)
        heads = KV if self.gqa else H
        k, v = self.kv(x).view(b, s, 2, heads, D).permute(2, 0, 3, 1, 4)
        if self.gqa:  # Hugging Face's repeat_kv
            k = k[:, :, None, :, :].expand(b, KV, H // KV, s, D).reshape(b, H, s, D)
            v = v[:, :, None, :, :].expand(b, KV, H // KV, s, D).reshape(b, H, s, D)
        mask = attention_mask if attention_mask is not None else \
            _mask(self.mask, s) if self.mask else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             is_causal=mask is None and self.gqa)
        return out.transpose(1, 2).reshape(b, s, H * D).tanh().sum()


def _x():
    return torch.randn(B, S, D, generator=torch.Generator().manual_seed(0))


def _rewrites(model, *args, **options) -> int:
    torch._dynamo.reset()
    with records.recording() as recs:
        trainc.compile(model, backend="aten", **options)(*args)
    return sum(r.sdpa_rewrites for r in recs)


@pytest.mark.parametrize("kind", ["bool", "float", "ones"])
def test_a_constant_causal_mask_becomes_is_causal_and_an_empty_one_goes(kind):
    torch.manual_seed(0)
    model = Attention(mask=kind)
    assert _rewrites(model, _x()) == 1
    assert _rewrites(model, _x(), sdpa_rewrite=False) == 0
    for backend in ("aten", "cpp"):
        assert_grads_match(model, [_x()], backend=backend)


def test_other_masks_are_left_as_written():
    torch.manual_seed(0)
    assert _rewrites(Attention(mask="shifted"), _x()) == 0
    model = Attention()
    causal_input = _mask("bool", S)  # a graph input: its value may change between calls
    assert _rewrites(model, _x(), causal_input) == 0
    assert_grads_match(Attention(mask="shifted"), [_x()], backend="cpp")


def test_repeated_kv_heads_become_enable_gqa():
    torch.manual_seed(0)
    model = Attention(gqa=True)
    assert _rewrites(model, _x()) == 1
    for backend in ("aten", "cpp"):
        assert_grads_match(model, [_x()], backend=backend)


def test_hugging_face_llama_mask_built_while_compiling(monkeypatch):
    """transformers < 5.24 always builds the mask under torch.compile; both rewrites apply to
    each layer and the step still matches eager."""
    transformers = pytest.importorskip("transformers")
    from transformers import masking_utils
    monkeypatch.setattr(masking_utils, "_ignore_causal_mask_sdpa", lambda *a, **k: False)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).train()
    ids = torch.randint(0, 256, (2, 144), generator=torch.Generator().manual_seed(0))

    def loss(ids):
        return model(input_ids=ids, labels=ids).loss

    assert _rewrites(loss, ids) == 2
    assert_grads_match(loss, [ids], backend="aten")

