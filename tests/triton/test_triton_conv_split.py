"""The split convolution backward (graph.py `_conv_backward_in_two`) natively on CUDA: cuDNN's
transposed convolution gives grad_input within the policy of eager's convolution_backward, in
float32 (TF32 off and on) and bfloat16. On CPU the same is checked through the interpreter in
tests/codegen/test_conv_backward_split.py."""
import copy

import pytest
import torch
import torch.nn as nn

import trainc
from policy import assert_policy
from trainc.codegen import graph

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=2), nn.ReLU(),
        nn.Conv2d(16, 8, 3, padding=2, dilation=2), nn.Flatten(), nn.Linear(8 * 9 * 9, 3))


def _grads(model, fn, x):
    x = x.detach().requires_grad_()
    loss = fn(x).float().square().mean()
    loss.backward()
    return [loss.detach(), x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("dtype,tf32", [(torch.float32, False), (torch.float32, True),
                                        (torch.bfloat16, False)])
def test_split_backward_on_cuda(monkeypatch, dtype, tf32):
    monkeypatch.setattr(graph, "SPLIT_CONV_BACKWARD_BYTES", 0)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    x = torch.randn(4, 3, 17, 17, device="cuda")
    base = _net().to("cuda")
    e_model, c_model = copy.deepcopy(base).to(dtype), copy.deepcopy(base).to(dtype)
    r_model = copy.deepcopy(base).double()
    e = _grads(e_model, e_model, x.to(dtype))
    c = _grads(c_model, trainc.compile(c_model, backend="triton"), x.to(dtype))
    r = _grads(r_model, r_model, x.double())
    for k, (cv, ev, rv) in enumerate(zip(c, e, r)):
        assert_policy(f"value {k}", cv, ev, rv)
