"""The model zoo: real model classes (transformers) from local configs, random weights.

`build(name, scale, device, dtype) -> Case`: the model in train mode and one batch; the loss is
the model's own (`model(**batch).loss`), so it is inside the compiled graph. No downloads.
Dropout is 0 everywhere: eager and compiled runs must see the same function to be compared.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

SCALES = ("tiny", "real")


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    family: str  # decoder | encoder | encdec | vit | cnn
    config: Callable[[str], object]  # scale -> transformers config
    model_class: str  # transformers class name
    batch: dict  # scale -> (batch size, seq len or image size)


@dataclasses.dataclass
class Case:
    name: str
    family: str
    model: torch.nn.Module
    batch: dict  # keyword arguments of model(...)

    def loss(self, fn: Callable) -> torch.Tensor:
        return fn(**self.batch).loss


_NO_DROPOUT = ("dropout", "dropout_rate", "hidden_dropout_prob", "attention_probs_dropout_prob",
               "attention_dropout", "activation_dropout", "resid_pdrop", "embd_pdrop",
               "attn_pdrop", "seq_classif_dropout", "qa_dropout", "classifier_dropout",
               "drop_path_rate", "hidden_dropout", "classifier_dropout_prob",
               "drop_connect_rate", "dropout_ratio", "layerdrop", "encoder_layerdrop",
               "decoder_layerdrop", "hidden_dropout_rate")


def _cfg(cls_name: str, **kw) -> object:
    import transformers
    transformers.logging.set_verbosity_error()
    cfg = getattr(transformers, cls_name)(**kw)
    for field in _NO_DROPOUT:
        if hasattr(cfg, field) and isinstance(getattr(cfg, field), float):
            setattr(cfg, field, 0.0)
    return cfg


def _by_scale(tiny: dict, real: dict, cls_name: str) -> Callable[[str], object]:
    return lambda scale: _cfg(cls_name, **(tiny if scale == "tiny" else real))


_LLAMA_REAL = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                   num_key_value_heads=8, intermediate_size=5632, vocab_size=32000,
                   max_position_embeddings=2048)
_DEC_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                 max_position_embeddings=128)

ENTRIES = [
    Entry("gpt2", "decoder", _by_scale(
        dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=128, bos_token_id=0,
             eos_token_id=0),
        dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024),
        "GPT2Config"), "GPT2LMHeadModel", {"tiny": (2, 64), "real": (8, 1024)}),
    Entry("llama", "decoder", _by_scale(_DEC_TINY, _LLAMA_REAL, "LlamaConfig"),
          "LlamaForCausalLM", {"tiny": (2, 64), "real": (4, 2048)}),
    Entry("mistral", "decoder", _by_scale(
        dict(_DEC_TINY, sliding_window=None),
        dict(_LLAMA_REAL, intermediate_size=5632, sliding_window=None), "MistralConfig"),
        "MistralForCausalLM", {"tiny": (2, 64), "real": (4, 2048)}),
    Entry("gemma", "decoder", _by_scale(
        dict(_DEC_TINY, head_dim=16),
        dict(hidden_size=2048, num_hidden_layers=18, num_attention_heads=8,
             num_key_value_heads=1, head_dim=256, intermediate_size=16384, vocab_size=256000,
             max_position_embeddings=2048), "GemmaConfig"),
        "GemmaForCausalLM", {"tiny": (2, 64), "real": (2, 2048)}),
    Entry("bert", "encoder", _by_scale(
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             vocab_size=256, max_position_embeddings=128),
        dict(max_position_embeddings=512), "BertConfig"),
        "BertForMaskedLM", {"tiny": (2, 64), "real": (16, 512)}),
    Entry("roberta", "encoder", _by_scale(
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             vocab_size=256, max_position_embeddings=130),
        dict(vocab_size=50265, max_position_embeddings=514), "RobertaConfig"),
        "RobertaForMaskedLM", {"tiny": (2, 64), "real": (16, 512)}),
    Entry("distilbert", "encoder", _by_scale(
        dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=256,
             max_position_embeddings=128),
        dict(), "DistilBertConfig"),
        "DistilBertForMaskedLM", {"tiny": (2, 64), "real": (16, 512)}),
    Entry("t5", "encdec", _by_scale(
        dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=256,
             decoder_start_token_id=0, pad_token_id=0),
        dict(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128,
             decoder_start_token_id=0, pad_token_id=0),
        "T5Config"), "T5ForConditionalGeneration", {"tiny": (2, 32), "real": (16, 512)}),
    Entry("bart", "encdec", _by_scale(
        dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
             vocab_size=256, max_position_embeddings=128, scale_embedding=True),
        dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
             decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
             vocab_size=50265, max_position_embeddings=1024, scale_embedding=True),
        "BartConfig"), "BartForConditionalGeneration", {"tiny": (2, 32), "real": (16, 512)}),
    Entry("vit", "vit", _by_scale(
        dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=128, num_labels=10),
        dict(image_size=224, patch_size=16, num_labels=1000), "ViTConfig"),
        "ViTForImageClassification", {"tiny": (2, 32), "real": (64, 224)}),
    Entry("swin", "vit", _by_scale(
        dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2],
             window_size=4, num_labels=10),
        dict(image_size=224, patch_size=4, embed_dim=96, depths=[2, 2, 6, 2],
             num_heads=[3, 6, 12, 24], window_size=7, num_labels=1000), "SwinConfig"),
        "SwinForImageClassification", {"tiny": (2, 32), "real": (64, 224)}),
    Entry("resnet", "cnn", _by_scale(
        dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
             num_labels=10),
        dict(num_labels=1000), "ResNetConfig"),
        "ResNetForImageClassification", {"tiny": (2, 32), "real": (64, 224)}),
    Entry("mobilenet_v2", "cnn", _by_scale(
        dict(depth_multiplier=0.25, image_size=32, num_labels=10),
        dict(num_labels=1000), "MobileNetV2Config"),
        "MobileNetV2ForImageClassification", {"tiny": (2, 32), "real": (64, 224)}),
    Entry("efficientnet", "cnn", _by_scale(
        dict(width_coefficient=0.25, depth_coefficient=0.2, image_size=32, hidden_dim=320,
             num_labels=10),
        dict(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280,
             num_labels=1000), "EfficientNetConfig"),
        "EfficientNetForImageClassification", {"tiny": (2, 32), "real": (64, 224)}),
    Entry("convnext", "cnn", _by_scale(
        dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, num_labels=10),
        dict(num_labels=1000), "ConvNextConfig"),
        "ConvNextForImageClassification", {"tiny": (2, 32), "real": (64, 224)}),
    Entry("regnet", "cnn", _by_scale(
        dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8,
             num_labels=10),
        dict(num_labels=1000), "RegNetConfig"),
        "RegNetForImageClassification", {"tiny": (2, 32), "real": (64, 224)}),
]
BY_NAME = {e.name: e for e in ENTRIES}
NAMES = [e.name for e in ENTRIES]


def build(name: str, scale: str = "tiny", device: str = "cpu",
          dtype: torch.dtype = torch.float32, seed: int = 0) -> Case:
    """The model (train mode, random init from `seed`) and one batch on `device`."""
    import transformers
    if name not in BY_NAME:
        raise ValueError(f"unknown zoo model {name!r}; known: {', '.join(NAMES)}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; known: {', '.join(SCALES)}")
    entry = BY_NAME[name]
    cfg = entry.config(scale)
    torch.manual_seed(seed)
    model = getattr(transformers, entry.model_class)(cfg).to(device=device, dtype=dtype).train()
    return Case(name, entry.family, model, _batch(entry, cfg, scale, device, dtype, seed))


def _batch(entry: Entry, cfg, scale: str, device: str, dtype: torch.dtype, seed: int) -> dict:
    n, size = entry.batch[scale]
    g = torch.Generator().manual_seed(seed + 1)
    if entry.family in ("vit", "cnn"):
        channels = getattr(cfg, "num_channels", 3)
        pixels = torch.randn(n, channels, size, size, generator=g)
        labels = torch.randint(0, cfg.num_labels, (n,), generator=g)
        return {"pixel_values": pixels.to(device, dtype), "labels": labels.to(device)}
    ids = torch.randint(0, cfg.vocab_size, (n, size), generator=g).to(device)
    return {"input_ids": ids, "labels": ids.clone()}


def to_float64(case: Case) -> Case:
    """The same model and batch in float64 (the policy's reference)."""
    import copy
    model = copy.deepcopy(case.model).double()
    batch = {k: v.double() if v.is_floating_point() else v for k, v in case.batch.items()}
    return Case(case.name, case.family, model, batch)
