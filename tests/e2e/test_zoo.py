"""Tiny zoo models (benchmarks/zoo: real transformers classes, random weights) compile on cpp
as one graph with no ATen fallbacks, and their loss and every parameter gradient pass the
float64 policy after one step. The other models run behind `python -m trainc bench`."""
import os
import sys

import pytest
import torch

pytest.importorskip("transformers", reason="the zoo needs the [zoo] extra (transformers)")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from zoo import models, run  # noqa: E402

CI_MODELS = [("llama", torch.float32), ("llama", torch.bfloat16), ("bert", torch.float32),
             ("vit", torch.float32), ("convnext", torch.float32), ("resnet", torch.bfloat16)]


@pytest.mark.parametrize("name,dtype", CI_MODELS)
def test_tiny_zoo_model_matches_float64(name, dtype):
    row = run.accuracy(name, "tiny", "cpu", dtype, "cpp")
    assert row["accuracy"] == "pass", row["mismatches"]
    assert row["fallbacks"] == [], row["fallbacks"]
    assert row["graphs"] == 1


def test_zoo_accuracy_still_fails_a_planted_wrong_gradient(monkeypatch):
    """The bf16 second opinion (run._second_opinion: the spread of emulated evaluations, which
    lets the tiny bf16 ResNet's ReLU flips pass) does not excuse a real error: log-softmax's
    backward 5% too large makes the classifier's gradients fail (their spread is ~1%)."""
    from trainc import decomps
    op = torch.ops.aten._log_softmax_backward_data.default
    right = decomps.TABLE[op]
    monkeypatch.setitem(decomps.TABLE, op, lambda *a, **k: right(*a, **k) * 1.05)
    row = run.accuracy("resnet", "tiny", "cpu", torch.bfloat16, "aten")
    assert row["accuracy"] == "fail"
    assert any("classifier.1" in m for m in row["mismatches"]), row["mismatches"]


def test_zoo_lists_every_family_and_refuses_unknown_names():
    assert {models.BY_NAME[n].family for n in models.NAMES} == {
        "decoder", "encoder", "encdec", "vit", "cnn"}
    with pytest.raises(ValueError, match="unknown zoo model"):
        models.build("alexnet")
    with pytest.raises(ValueError, match="unknown scale"):
        models.build("llama", "huge")


def test_summary_leaves_failed_models_out_of_speed_figures():
    rows = [{"model": "a", "accuracy": "pass", "eager_ms": 2.0, "inductor_ms": 1.0,
             "trainc_ms": 1.0},
            {"model": "b", "accuracy": "fail", "eager_ms": 2.0, "inductor_ms": 1.0,
             "trainc_ms": 4.0}]
    s = run.summarize(rows)
    assert s["passed"] == 1 and s["trainc_over_inductor"] == pytest.approx(1.0)
    assert s["trainc_speedup_over_eager"] == pytest.approx(2.0)
