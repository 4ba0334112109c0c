"""The shared suite's models at scale "cpu" with backend="triton": loss and gradients match the
float64 eager reference (DESIGN.md policy). On CUDA it uses the model's device as built."""
import copy

import pytest
import torch

import triton_helpers  # noqa: F401  (skips the module without triton)
import trainc
from policy import assert_policy
from triton_helpers import DEVICE

import models  # noqa: E402  benchmarks/suite_models (tests/conftest.py puts it on the path)


def _grads(model, fn, inputs, loss_fn):
    xs = tuple(x.detach().requires_grad_(x.requires_grad) for x in inputs)
    loss = loss_fn(fn(*xs), xs)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


# The interpreter runs gpt and convnet in ~35 s and ~20 s: slow on CPU, default on CUDA.
_SLOW_ON_CPU = {"gpt", "convnet"}
NAMES = [pytest.param(n, marks=pytest.mark.slow) if DEVICE == "cpu" and n in _SLOW_ON_CPU else n
         for n in models.NAMES]


@pytest.mark.parametrize("name", NAMES)
def test_suite_model_grads(name):
    _check_model(name)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="probes cuDNN")
def test_convnet_channels_last_where_eager_runs_tf32():
    """conv_channels_last="eager_tf32": float32 convolutions go channels-last (TF32) only where
    eager's NCHW call runs TF32 too. At this scale eager's NCHW convolutions were exact on the
    H200 and all-channels-last float32 put features.0.weight at 166x eager's error."""
    _check_model("convnet", conv_channels_last="eager_tf32")


def _check_model(name, **options):
    model, inputs, loss_fn = models.build(name, device=DEVICE)
    model.eval()  # dropout draws differ from eager's generator; policy compares the rest
    ref_model = copy.deepcopy(model).double()
    ref_in = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    e_model, c_model = copy.deepcopy(model), copy.deepcopy(model)
    e = _grads(e_model, e_model, inputs, loss_fn)
    c = _grads(c_model, trainc.compile(c_model, backend="triton", **options), inputs, loss_fn)
    r = _grads(ref_model, ref_model, ref_in, loss_fn)
    assert_policy(f"{name} loss", c[0], e[0], r[0])
    for n in r[1]:
        assert_policy(f"{name} grad {n}", c[1][n], e[1][n], r[1][n])
