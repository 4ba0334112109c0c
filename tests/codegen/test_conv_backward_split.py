"""A large convolution backward is two calls (graph.py `_conv_backward_in_two`): grad_weight,
then grad_input as the transposed convolution of grad_output, which does not read the input, so
an input read by nothing later is freed before grad_input is allocated. Gradients match eager
with strides, groups, dilation, bias and odd sizes; the split is forced here by a zero size
threshold."""
import re

import pytest
import torch
import torch.nn as nn

import trainc
from trainc.codegen import graph
from trainc.testing import assert_grads_match

BACKENDS = ["cpp", pytest.param("triton", marks=pytest.mark.skipif(
    pytest.importorskip("importlib").util.find_spec("triton") is None,
    reason="triton is not installed"))]


@pytest.fixture
def split_all(monkeypatch):
    monkeypatch.setattr(graph, "SPLIT_CONV_BACKWARD_BYTES", 0)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), nn.ReLU(),  # odd input: extra row
        nn.Conv2d(8, 4, 3, padding=2, dilation=2), nn.Flatten(), nn.Linear(4 * 5 * 5, 3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_backward_matches_eager(backend, split_all):
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    assert_grads_match(_net(), [x], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_input_is_freed_between_the_two_calls(backend, split_all, tmp_path):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, padding=1)
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    f = trainc.compile(conv, backend=backend, debug_dir=str(tmp_path), cache_artifacts=False)
    f(x).square().mean().backward()
    src = next(tmp_path.rglob("31_bwd_wrapper.py")).read_text()
    lines = src.splitlines()
    wgrad = next(i for i, l in enumerate(lines) if "[False, True, True]" in l)
    dgrad = next(i for i, l in enumerate(lines) if re.search(r"None, \[1, 1\], \[1, 1\], \[1, 1\], "
                                                              r"True, \[0, 0\], 1\)", l))
    # the saved input is the call's second argument: deleted after grad_weight, before grad_input
    x_arg = re.search(r"op_\d+\((\w+)(?:\.as_strided\([^)]*\))?, (\w+)", lines[wgrad]).group(2)
    dels = [i for i, l in enumerate(lines) if l.strip() == f"del {x_arg}"]
    assert wgrad < dels[0] < dgrad, (wgrad, dels, dgrad)


def test_small_convolutions_stay_one_call(tmp_path):
    conv = nn.Conv2d(4, 6, 3, padding=1)
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    f = trainc.compile(conv, backend="cpp", debug_dir=str(tmp_path), cache_artifacts=False)
    f(x).square().mean().backward()
    src = next(tmp_path.rglob("31_bwd_wrapper.py")).read_text()
    assert src.count("[True, True, True]") == 1 and "[False, True, True]" not in src
