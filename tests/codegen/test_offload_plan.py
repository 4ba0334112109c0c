"""codegen/memory/offload.py: where a wrapper's copies to host and back are placed, from the
rough item times and the host link's bandwidth, and what the memory plan counts then."""
from __future__ import annotations

import os

import torch
from torch.fx.experimental.proxy_tensor import make_fx

os.environ.setdefault("TRITON_INTERPRET", "1")

from trainc.codegen import get_backend  # noqa: E402
from trainc.codegen.driver import memory_model  # noqa: E402
from trainc.codegen.memory import offload as O  # noqa: E402
from trainc.config import make_config  # noqa: E402

N = 512  # [N, N] float32: 1 MiB a value


def _forward(x, w):  # four values made in turn, each also read by the next layer
    a = torch.tanh(x @ w)
    b = torch.tanh(a @ w)
    c = torch.tanh(b @ w)
    return torch.tanh(c @ w).sum(), a, b, c


def _backward(a, b, c, g):  # reads c first, a last
    g = torch.tanh(g * c) @ c
    g = torch.tanh(g * b) @ b
    return torch.tanh(g * a) @ a


def _model(fn, n_inputs):
    gm = make_fx(fn)(*[torch.randn(N, N) for _ in range(n_inputs)])
    backend = get_backend("triton", torch.device("cpu"), make_config("triton"))
    inputs = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    return memory_model(backend, gm, inputs)


def test_saves_free_the_device_copy_once_the_copy_is_done():
    plan_of = _model(_forward, 2)
    base = plan_of(None)
    fast = plan_of(O.OffloadRequest(outputs=(1, 2, 3), bandwidth=1e18))
    assert fast.moved == (1, 2, 3) and fast.offload.late == 0
    assert fast.live_bytes[-1] == base.live_bytes[-1] - 3 * N * N * 4  # all three freed
    slow = plan_of(O.OffloadRequest(outputs=(1, 2, 3), bandwidth=1e3))
    assert slow.offload.late == 3  # none done before the forward ends: held to its end
    assert slow.peak_bytes >= fast.peak_bytes


def test_loads_start_just_in_time_when_the_link_is_fast_and_early_when_slow():
    plan_of = _model(_backward, 4)
    fast = plan_of(O.OffloadRequest(inputs=(0, 1, 2), bandwidth=1e18)).offload
    order = [b for b, _, _ in fast.load]
    assert [u for _, _, u in fast.load] == sorted(u for _, _, u in fast.load)
    # issued just before the first reader (a copy takes time: before the item ahead of it)
    assert all(max(u - 1, 0) <= p <= u for _, p, u in fast.load), fast
    assert len({u for _, _, u in fast.load}) == 3 and fast.stall_seconds < 1e-9
    slow = plan_of(O.OffloadRequest(inputs=(0, 1, 2), bandwidth=1e6)).offload
    assert [b for b, _, _ in slow.load] == order
    assert all(p == 0 for _, p, _ in slow.load) and slow.stall_seconds > 0, slow


def test_small_values_and_inputs_do_not_move():
    plan_of = _model(_forward, 2)
    saved = plan_of(O.OffloadRequest(outputs=(0, 1), bandwidth=1e18))
    assert saved.moved == (1,)  # output 0 is the 4-byte loss
