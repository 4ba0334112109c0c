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
