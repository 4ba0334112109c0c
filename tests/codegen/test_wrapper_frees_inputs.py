"""The compiled backward frees each saved activation after its last use: run(args) takes its
argument list over and the runtime drops autograd's references first
(`ctx.maybe_clear_saved_tensors`), so the backward's peak does not hold every saved value until
it returns. A retained graph keeps them (a second backward works)."""
import torch

import trainc
from trainc.report import peak_bytes

N, D, K = 4096, 1024, 256  # the backward makes x.grad (N x D) after the saved N x K dies


def f(x, w1, w2):
    return (torch.tanh(x @ w1) @ w2).sum()


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(N, D, requires_grad=True), (torch.randn(D, K) / 32).requires_grad_(),
            (torch.randn(K, 1) / 16).requires_grad_()]


def _step_peak(fn, hold: bool) -> tuple[int, list]:
    args = _inputs()
    held = []  # hold: someone else keeps the saved values (the old behaviour)
    pack = (lambda t: (held.append(t), t)[1]) if hold else (lambda t: t)

    def step():  # forward too: the CPU measurement sees frees only of what it saw allocated
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = fn(*args)
        loss.backward()
    return peak_bytes(step, torch.device("cpu")), [a.grad for a in args]


def test_saved_activations_are_freed_during_the_backward():
    fn = trainc.compile(f, backend="cpp")
    _step_peak(fn, False)  # compiles
    freed, grads = _step_peak(fn, False)
    held, _ = _step_peak(fn, True)
    activation = N * K * 4
    assert freed <= held - 0.9 * activation, (freed, held)
    ref = _inputs()
    f(*ref).backward()
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r.grad, rtol=1e-4, atol=1e-4)


def test_a_retained_graph_keeps_its_saved_values():
    fn = trainc.compile(f, backend="cpp")
    args = _inputs()
    loss = fn(*args)
    loss.backward(retain_graph=True)
    first = [a.grad.clone() for a in args]
    loss.backward()
    for a, g in zip(args, first):
        torch.testing.assert_close(a.grad, 2 * g)
