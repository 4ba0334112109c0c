"""regions="auto" (trainc/layer_regions.py): repeated layers compile as one graph every layer runs;
results and every parameter's gradient pass the float64 policy; the count of compiled graphs does
not grow with depth; per-instance guards are warned about, never silently worked around."""
import os
import sys
import warnings

import pytest
import torch

import trainc
import trainc.testing
from trainc import records


class Block(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)

    def forward(self, x, scale=None):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return x + (h if scale is None else h * scale)


class Stack(torch.nn.Module):
    def __init__(self, layers: int, d: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(8, d)
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(layers))
        self.out = torch.nn.Linear(d, 4)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h).square().mean()


def _x():
    return torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(1)).requires_grad_(True)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_stack_matches_float64(backend):
    trainc.testing.assert_grads_match(Stack(3), [_x()], backend=backend, regions="auto")


def test_sequential_stack_and_budget_fraction_match_float64():
    torch.manual_seed(0)
    seq = torch.nn.Sequential(torch.nn.Linear(8, 16), Block(16), Block(16), Block(16),
                              torch.nn.Linear(16, 4))
    trainc.testing.assert_grads_match(seq, [_x()], backend="cpp", regions="auto",
                                      memory_budget=0.0)


class TwoStacks(torch.nn.Module):
    """An encoder stack beside repeated heads: the encoder holds a group and is no region."""
    def __init__(self):
        super().__init__()
        self.enc = Stack(2)
        self.heads = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        for h in self.heads:
            x = torch.tanh(h(x))
        return self.enc(x)


def test_nested_owners_match_float64():
    torch.manual_seed(0)
    trainc.testing.assert_grads_match(TwoStacks(), [_x()], backend="cpp", regions="auto")
    torch._dynamo.reset()
    e = trainc.explain(TwoStacks(), _x(), backend="aten", regions="auto")
    assert sorted(r.name for r in e.regions) == [
        "enc.blocks[0..1] (Block)", "enc.inp", "enc.out", "heads[0..1] (Linear)"]


def _compiled_graphs(layers: int) -> tuple[int, trainc.Explanation]:
    torch._dynamo.reset()
    e = trainc.explain(Stack(layers), _x(), backend="aten", regions="auto")
    return len(e.graphs), e


def test_compiled_graphs_do_not_grow_with_depth():
    n2, _ = _compiled_graphs(2)
    n6, e = _compiled_graphs(6)
    assert n2 == n6 == 3  # inp, one block graph for every block, out + loss
    (blocks,) = [r for r in e.regions if r.shared]
    assert len(blocks.instances) == 6 and blocks.calls == 6 and len(blocks.graph_ids) == 1
    assert "blocks[0..5] (Block): 6 instance(s), 6 call(s), 1 Dynamo graph(s)" in str(e)
    block = next(g for g in e.graphs if g.graph_id == blocks.graph_ids[0])
    assert e.runs[block.graph_id] == 6 and block.saved_bytes > 0
    assert e.saved_bytes == sum(g.saved_bytes for g in e.graphs) + 5 * block.saved_bytes
    assert e.predicted_peak is None  # per-run graph peaks do not add up to the step's


def test_model_outside_the_compiled_call_runs_eagerly():
    torch._dynamo.reset()
    m = Stack(2)
    compiled = trainc.compile(m, backend="aten", regions="auto")
    x = _x()
    with records.recording() as recs:
        expected = m(x)  # the user's module, called directly: nothing compiles
    assert not recs and not recs.regions
    torch.testing.assert_close(compiled(x), expected)


class Scaled(Stack):
    """Each block reads a per-instance Python float: Dynamo guards on it, no graph is shared."""
    def __init__(self, layers):
        super().__init__(layers)
        for i, b in enumerate(self.blocks):
            b.scale = 1.0 + i

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h, b.scale)
        return self.out(h).square().mean()


def test_per_instance_guard_is_reported():
    torch._dynamo.reset()
    m, x = Scaled(3), _x()
    with pytest.warns(UserWarning, match=r"blocks.1 did not reuse the graph compiled for "
                                         r"blocks.0 .*guard failed"):
        e = trainc.explain(m, x, backend="aten", regions="auto")
    (blocks,) = [r for r in e.regions if r.shared]
    assert [i for i, _ in blocks.not_reused] == ["blocks.1", "blocks.2"]
    assert "not reused by blocks.2: guard failed" in str(e)
    with pytest.warns(UserWarning, match="did not reuse"):
        torch.testing.assert_close(
            trainc.compile(Scaled(3), backend="aten", regions="auto")(x), Scaled(3)(x))


def test_int_budget_is_refused_with_regions():
    with pytest.raises(ValueError, match="int memory_budget"):
        trainc.compile(Stack(2), regions="auto", memory_budget=1 << 20)
    with pytest.raises(ValueError, match="regions must be"):
        trainc.compile(Stack(2), regions="on")
    with pytest.raises(ValueError, match="compile_step"):
        trainc.compile_step(Stack(2), lambda m, x: m(x), None, regions="auto")
    with pytest.raises(Exception, match="needs trainc.compile"):  # Dynamo wraps it
        torch.compile(Stack(2), backend="trainc", options={"regions": "auto"})(_x())


@pytest.mark.parametrize("backend", ["cpp", pytest.param("triton", marks=pytest.mark.slow)])
def test_tiny_zoo_llama_shares_one_layer_graph(backend):
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from zoo import models
    torch._dynamo.reset()
    cases = [models.build("llama", "tiny") for _ in range(2)]
    ref = models.to_float64(cases[1])

    def step(case, fn):
        loss = fn(**case.batch, use_cache=False).loss
        loss.backward()
        return loss.detach()

    with records.recording() as recs:
        loss = step(cases[0], trainc.compile(cases[0].model, backend=backend, regions="auto"))
    (layers,) = [r for r in recs.regions if r.shared]
    assert layers.calls == 2 and len(layers.graph_ids) == 1 and not layers.not_reused
    vals = [("loss", loss, step(cases[1], cases[1].model), step(ref, ref.model))]
    for (n, p), pe, pr in zip(cases[0].model.named_parameters(), cases[1].model.parameters(),
                              ref.model.parameters()):
        vals.append((f"grad {n}", p.grad, pe.grad, pr.grad))
    bad = [m for v in vals if (m := trainc.testing.compare(*v)) is not None]
    assert not bad, bad
    assert len(vals) == 1 + len(list(ref.model.parameters()))


def test_kv_cache_guard_is_named():
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from zoo import models
    torch._dynamo.reset()
    case = models.build("llama", "tiny")
    fn = trainc.compile(case.model, backend="aten", regions="auto")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(**case.batch, use_cache=True).loss.backward()
    assert any("did not reuse" in str(w.message) and "is_initialized" in str(w.message)
               for w in caught), [str(w.message) for w in caught]


class InPlaceAfterRegion(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.seq = torch.nn.Sequential(Block(8), Block(8))

    def forward(self, x):
        h = self.seq(x)
        h += x  # the graph after the Sequential's graph break receives h as an input
        return h.sum()


def test_in_place_on_a_region_output_is_a_clear_error():
    torch._dynamo.reset()
    with pytest.raises(trainc.UnsupportedError, match="requires grad is mutated in place"):
        trainc.compile(InPlaceAfterRegion(), backend="cpp", regions="auto")(_x())
