"""CUDA wrappers allocate through Dynamo's current-device entry point (`wrapper.cuda_empty`),
and through torch.empty_strided on the graph's device when another device is current."""
import pytest
import torch

import trainc
from trainc.codegen import wrapper

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def f(a, b):
    return (a @ b).relu().sum(0), torch.softmax(a, 1) * 2


def test_cuda_wrapper_allocates_through_the_current_device_entry(monkeypatch):
    assert wrapper.EMPTY_CUDA is not None
    used = []
    real = wrapper.EMPTY_CUDA
    monkeypatch.setattr(wrapper, "EMPTY_CUDA", lambda *a: (used.append(a), real(*a))[1])
    a, b = torch.randn(64, 96, device="cuda"), torch.randn(96, 96, device="cuda")
    fn = trainc.compile(f, backend="triton")
    for x, y in zip(fn(a, b), f(a, b)):
        torch.testing.assert_close(x, y)
    assert used, "no buffer went through _empty_strided_cuda"


def test_other_current_device_falls_back_to_empty_strided(monkeypatch):
    dev = torch.device("cuda", torch.cuda.current_device())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: dev.index + 1)
    empty = wrapper.cuda_empty(dev)
    assert empty is not wrapper.EMPTY_CUDA
    t = empty((4, 3), (1, 4), torch.float16)
    assert t.device == dev and t.stride() == (1, 4) and t.dtype == torch.float16
