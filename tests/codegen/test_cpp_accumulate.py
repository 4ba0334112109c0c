"""The backward that adds parameter gradients into .grad in place (trainc/accumulate.py): used
only where autograd would do that add itself; every guarded-off case gets eager's gradients."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

import trainc
from trainc import accumulate


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(16), nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x, z=None):
        y = self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
        return y if z is None else y * z


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    net = _Net()
    ref = _Net().double()
    ref.load_state_dict(net.state_dict())
    return torch.compile(net, backend="trainc", options={"backend": "cpp",
                                                         "accumulate_grads": True}), net, ref


@pytest.fixture
def used(monkeypatch):
    """Per backward: whether the in-place path ran."""
    calls: list[bool] = []
    real = accumulate.targets

    def spy(*a):
        out = real(*a)
        calls.append(out is not None)
        return out
    monkeypatch.setattr(accumulate, "targets", spy)
    return calls


def _x(seed: int, dtype=torch.float32):
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _start(net, ref, grads: bool = True):
    for p, q in zip(net.parameters(), ref.parameters()):
        p.grad = torch.randn_like(p) if grads else None
        q.grad = None if p.grad is None else p.grad.double()


def _assert_grads(net, ref):
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        if q.grad is None:
            assert p.grad is None, name
            continue
        err = ((p.grad.double() - q.grad).norm() / q.grad.norm()).item()
        assert err < 1e-5, f"{name}: relative error {err}"


def test_accumulates_into_existing_grads(models, used):
    fn, net, ref = models
    _start(net, ref)
    grads = [p.grad for p in net.parameters()]
    versions = [g._version for g in grads]
    for seed in range(3):
        fn(_x(seed)).pow(2).sum().backward()
        ref(_x(seed, torch.float64)).pow(2).sum().backward()
    assert used == [True] * 3
    _assert_grads(net, ref)
    assert all(p.grad is g for p, g in zip(net.parameters(), grads)), "grads were replaced"
    assert all(g._version > v for g, v in zip(grads, versions)), "versions not bumped"


def test_without_grads_autograd_adopts_fresh_ones(models, used):
    fn, net, ref = models
    _start(net, ref, grads=False)
    for seed in range(2):
        fn(_x(seed)).sum().backward()
        ref(_x(seed, torch.float64)).sum().backward()
    assert used == [False, True]
    _assert_grads(net, ref)


def test_tensor_hooks_see_the_gradient(models, used):
    fn, net, ref = models
    _start(net, ref)
    seen = []
    h = net.fc1.weight.register_hook(lambda g: seen.append(g.clone()) or g * 2)
    hr = ref.fc1.weight.register_hook(lambda g: g * 2)
    try:
        fn(_x(0)).sum().backward()
        ref(_x(0, torch.float64)).sum().backward()
    finally:
        h.remove()
        hr.remove()
    assert used == [False] and len(seen) == 1
    _assert_grads(net, ref)


def test_post_accumulate_hooks_see_the_sum(models, used):
    fn, net, ref = models
    _start(net, ref)
    seen = []
    h = net.fc2.bias.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    try:
        fn(_x(0)).sum().backward()
    finally:
        h.remove()
    ref(_x(0, torch.float64)).sum().backward()
    assert used == [True]
    assert torch.allclose(seen[0].double(), ref.fc2.bias.grad, rtol=1e-5, atol=1e-6)


def test_autograd_grad_returns_gradients_and_leaves_grads_alone(models, used):
    fn, net, ref = models
    _start(net, ref)
    before = [p.grad.clone() for p in net.parameters()]
    got = torch.autograd.grad(fn(_x(0)).sum(), list(net.parameters()))
    want = torch.autograd.grad(ref(_x(0, torch.float64)).sum(), list(ref.parameters()))
    assert used == [False]
    for g, w in zip(got, want):
        assert torch.allclose(g.double(), w, rtol=1e-5, atol=1e-6)
    assert all(torch.equal(p.grad, b) for p, b in zip(net.parameters(), before))


def test_backward_inputs_touches_only_those(models, used):
    fn, net, ref = models
    _start(net, ref)
    fn(_x(0)).sum().backward(inputs=[net.fc1.weight])
    ref(_x(0, torch.float64)).sum().backward(inputs=[ref.fc1.weight])
    assert used == [False]
    _assert_grads(net, ref)


def test_retain_graph_twice_adds_twice(models, used):
    fn, net, ref = models
    _start(net, ref)
    for m, x in ((fn, _x(0)), (ref, _x(0, torch.float64))):
        loss = m(x).sum()
        loss.backward(retain_graph=True)
        loss.backward()
    assert used == [True, True]
    _assert_grads(net, ref)


def test_other_layouts_and_aliased_inputs_are_left_to_autograd(models, used):
    fn, net, ref = models
    _start(net, ref)
    w = net.fc1.weight
    w.grad = torch.randn(w.shape[1], w.shape[0]).t()  # transposed .grad: autograd keeps it
    ref.fc1.weight.grad = w.grad.double()
    fn(_x(0)).sum().backward()
    ref(_x(0, torch.float64)).sum().backward()
    _start(net, ref)
    z = net.fc2.bias.grad  # an input the backward reads is also a .grad it would write
    fn(_x(1), z).sum().backward()
    ref(_x(1, torch.float64), ref.fc2.bias.grad.clone()).sum().backward()
    assert used == [False, False]
    _assert_grads(net, ref)


def test_create_graph_still_refuses(models):
    fn, net, ref = models
    _start(net, ref)
    with pytest.raises(RuntimeError, match="double backward"):
        fn(_x(0)).sum().backward(create_graph=True)


def _acc_source(monkeypatch) -> list[str]:
    """The accumulating backward's wrapper lines for a fresh _Net."""
    import trainc.capture as capture
    arts = []
    real = capture.compile_graph
    monkeypatch.setattr(capture, "compile_graph", lambda *a, **k: arts.append(real(*a, **k))
                        or arts[-1])
    torch.manual_seed(0)
    # cpp_gemm="aten": "auto" times oneDNN against ATen per call, and its pick changes the lines
    trainc.compile(_Net(), backend="cpp", accumulate_grads=True,
                   cpp_gemm="aten")(_x(0)).sum().backward()
    return [ln.strip() for ln in arts[0].bwd_acc.source.split("run(args):")[1].splitlines()]


def test_weight_gradients_are_added_by_addmm_into_grad(monkeypatch):
    lines = _acc_source(monkeypatch)
    adds = [ln for ln in lines if "extern in place addmm_" in ln]
    assert len(adds) == 2, "fc1.weight and fc2.weight: .grad += a @ b in one library call"
    assert not any("[32, 16]" in ln or "[16, 32]" in ln for ln in lines if "empty" in ln), \
        "a weight-shaped gradient buffer is still allocated"


def test_each_other_gradient_is_added_right_after_it_is_made(monkeypatch):
    monkeypatch.setattr(accumulate, "_product", lambda *a: None)  # an mm now makes a buffer
    lines = _acc_source(monkeypatch)
    into = set(re.findall(r"= (arg\d+)  # in place", "\n".join(lines)))
    calls = [ln for ln in lines if re.match(r"(op_\d+|K\.kernel\w+)\(", ln)]
    adds = 0
    for k, ln in enumerate(calls):
        out = re.search(r"out=(buf\d+)\)  # mm", ln)
        if not out:
            continue
        # one of the next two calls adds the product into a .grad (it may share its launch
        # with other small work, e.g. the bias gradient's sum)
        for nxt in calls[k + 1:k + 3]:
            names = set(re.findall(r"(?:arg|buf)\d+", nxt))
            if out.group(1) in names and names & into:
                adds += 1
                break
    assert adds == 2, "fc1.weight and fc2.weight: mm, then the add into .grad"


def test_small_gradients_keep_one_backward():
    arts = []
    import trainc.capture as capture
    real = capture.compile_graph
    try:
        capture.compile_graph = lambda *a, **k: arts.append(real(*a, **k)) or arts[-1]
        for option in (None, False):
            torch.manual_seed(0)
            trainc.compile(_Net(), backend="cpp", accumulate_grads=option)(_x(0)).sum().backward()
    finally:
        capture.compile_graph = real
    assert [a.bwd_acc for a in arts] == [None, None], "1.7 KiB of gradients: not worth it"
    assert [a.bwd is not None for a in arts] == [True, True]
