"""The step's predicted peak (partition/step_peak.py): its arithmetic on hand-made memory plans,
and on cpp against the peak measured by the CPU allocator's events (gradients counted)."""
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import trainc
from trainc.codegen.memory import MemoryPlan
from trainc.codegen.memory.walk import Event
from trainc.partition import BudgetError
from trainc.partition.step_peak import step_peak
from trainc.report import peak_bytes


def _plan(deltas, inputs=()):
    """Events (kind, buffer, delta) -> a MemoryPlan with those tensor inputs."""
    events = tuple(Event(i, kind, buf, delta) for i, (kind, buf, delta) in enumerate(deltas))
    return MemoryPlan(events, (), (), inputs=tuple(inputs))


def _bwd_graph(*names):
    g = fx.Graph()
    for n in names:
        p = g.placeholder(n)
        p.meta["val"] = torch.empty(1)
    g.output([])
    return fx.GraphModule(torch.nn.Module(), g)


def test_arithmetic_by_hand():
    # forward: saved a (100 B) and b (50), a loss (10) the caller holds, a temporary (200)
    fwd = _plan([("alloc", "a", 100), ("alloc", "b", 50), ("alloc", "loss", 10),
                 ("alloc", "tmp", 200), ("free", "tmp", -200)])
    # backward: inputs a, b, the tangent; a gradient of 80 B, a freed after event 1, then 300
    bwd = _plan([("alloc", "g1", 80), ("free", "arg0", 0), ("alloc", "g2", 300),
                 ("free", "arg1", 0)], inputs=[("arg0", 100), ("arg1", 50), ("arg2", 4)])
    graph = _bwd_graph("a", "b", "tangents_0")
    p = step_peak(fwd, bwd, graph, {"a": "a", "b": "b"}, {"a": 100, "b": 50}, outputs_held=True)
    # forward peak 360; backward: event 0: 150 saved + 10 loss + 80 = 240; event 2: a freed:
    # 50 + 10 + 380 = 440
    assert (p.forward_peak, p.backward_peak, p.peak, p.phase) == (360, 440, 440, "backward")
    assert (p.saved_held, p.outputs_held, p.backward_live) == (50, 10, 380)
    assert str(p).startswith("predicted step peak 0.0 MiB in the backward")
    dropped = step_peak(fwd, bwd, graph, {"a": "a", "b": "b"}, {"a": 100, "b": 50})
    assert (dropped.backward_peak, dropped.outputs_held, dropped.outputs) == (430, 0, 10)


def test_saved_values_the_backward_never_reads_die_at_once():
    fwd = _plan([("alloc", "a", 100), ("alloc", "b", 50)])
    bwd = _plan([("alloc", "g", 80)], inputs=[("arg0", 100), ("arg1", 4)])
    p = step_peak(fwd, bwd, _bwd_graph("a", "tangents_0"), {"a": "a", "b": "b"},
                  {"a": 100, "b": 50})
    # b is no input of the backward: only a is held during it (never freed: held to the end)
    assert (p.backward_peak, p.saved_held, p.phase) == (180, 100, "backward")
    assert p.peak == 180


def _residual_mlp(rows: int):
    """Four residual GELU-MLP blocks sharing two weights, and its inputs (x: rows x 64)."""
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(64, 256, generator=g, requires_grad=True)
    w2 = torch.randn(256, 64, generator=g, requires_grad=True)
    x = torch.randn(rows, 64, generator=g, requires_grad=True)

    def f(x, w1, w2):
        for _ in range(4):
            x = x + torch.tanh(F.gelu(x @ w1) @ w2)
        return x.square().mean()
    return f, x, w1, w2


def test_predicted_step_peak_within_10_percent_of_measured_on_cpp():
    f, x, w1, w2 = _residual_mlp(2048)
    for budget in (None, 0.0):
        torch._dynamo.reset()
        opts = dict(backend="cpp", memory_budget=budget, cpp_keep_buffers=False,
                    accumulate_grads=False)
        ex = trainc.explain(f, x, w1, w2, **opts)
        predicted = ex.predicted_peak
        torch._dynamo.reset()
        c = trainc.compile(f, **opts)
        c(x, w1, w2).backward()
        for t in (x, w1, w2):
            t.grad = None
        measured = peak_bytes(lambda: c(x, w1, w2).backward(), torch.device("cpu"))
        assert predicted is not None
        assert abs(predicted - measured) <= 0.1 * measured, (budget, predicted, measured)


def test_budget_caps_the_predicted_peak_on_cpp():
    """A fraction f caps the step's predicted peak at low + f * (default - low), read against
    the wrappers' memory plans (not the partitioner's simulation); an int caps it in bytes
    (graph inputs counted), and one below the lowest plan names the smallest feasible cap."""
    f, x, w1, w2 = _residual_mlp(1024)

    def explain(budget):
        torch._dynamo.reset()
        return trainc.explain(f, x, w1, w2, backend="cpp", memory_budget=budget,
                              accumulate_grads=False)

    peaks = {b: explain(b).predicted_peak for b in (None, 0.0, 0.25, 0.5)}
    low, default = peaks[0.0], peaks[None]
    assert low < default
    for b in (0.25, 0.5):
        assert low <= peaks[b] <= low + b * (default - low), (b, peaks)
    assert peaks[0.25] <= peaks[0.5]
    half = explain(0.5)
    assert any("predicted step peak cap" in n for gr in half.graphs for n in gr.partition_notes)
    assert "predicted step peak cap" in str(half)
    with pytest.raises(BudgetError, match="needs memory_budget >= ") as err:
        explain(1)
    smallest = int(str(err.value).split("memory_budget >= ")[1].split(" ")[0])
    fixed = smallest - low  # the graph's inputs: parameters, x and the loss's tangent
    assert fixed > 0
    capped = explain(fixed + peaks[0.5]).predicted_peak
    assert capped <= peaks[0.5]
