"""Config.partition_objective: "bytes" (fewest saved bytes) or "balanced" (saved bytes +
recompute cost); the default is balanced on cpp for graphs without convolutions or pooling,
else bytes (pipeline._objective). Both are correct plans: gradients match eager."""
import pytest
import torch
import torch.nn as nn

import trainc
from trainc.testing import assert_grads_match


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))


def _conv():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 5))


def _saved(model, x, **options) -> tuple:
    torch._dynamo.reset()  # each call compiles the same forward code again with other options
    graphs = trainc.explain(model, x, cache_artifacts=False, **options).graphs
    return tuple(d.name for g in graphs for d in g.decisions if d.action == "saved")


def test_objectives_differ_and_both_match_eager():
    x = torch.randn(8, 16)
    bytes_, balanced = (_saved(_mlp(), x, backend="aten", partition_objective=o)
                        for o in ("bytes", "balanced"))
    # balanced saves the GELU output; bytes saves its input and recomputes it (erf)
    assert "gelu" in balanced and "gelu" not in bytes_
    for o in ("bytes", "balanced"):
        assert_grads_match(_mlp(), [x], backend="cpp", partition_objective=o)


def test_default_is_balanced_on_cpp_without_convolutions():
    x = torch.randn(8, 16)
    assert _saved(_mlp(), x, backend="cpp") == _saved(_mlp(), x, backend="cpp",
                                                       partition_objective="balanced")
    assert _saved(_mlp(), x, backend="aten") == _saved(_mlp(), x, backend="aten",
                                                        partition_objective="bytes")


def test_default_is_bytes_for_convolutions():
    x = torch.randn(2, 3, 8, 8)
    assert _saved(_conv(), x, backend="cpp") == _saved(_conv(), x, backend="cpp",
                                                        partition_objective="bytes")


def test_unknown_objective_is_refused():
    with pytest.raises(ValueError, match="partition_objective"):
        trainc.compile(_mlp(), partition_objective="fast")
