"""The mutation safety checker: accepts correct reinplacing, catches planted wrong ones (a stale
read, a write into an unmutated input, overlapping views, an output sharing a mutated input)."""
from __future__ import annotations

import sys

import pytest
import torch
import torch.fx as fx

from pass_programs import copy_gm, program_inputs, random_program, traced
from test_reinplace import _split
from trainc import pipeline
from trainc.config import make_config
from trainc.graph import InputKind
from trainc.passes import MutationError, check_mutations, reinplace_ops
from trainc.passes.check_mutations import find_mutation_problems
from trainc.passes.reinplace_ops import MUTABLE_INPUTS

aten = torch.ops.aten


def _graph(fn, *shapes) -> fx.GraphModule:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    with FakeTensorMode():
        return make_fx(fn)(*[torch.empty(s) for s in shapes])


def _plant(gm: fx.GraphModule, functional, inplace, nth: int = 0) -> fx.GraphModule:
    """Rewrite the nth `functional` node into `inplace` without any safety check."""
    node = [n for n in gm.graph.nodes if n.target is functional][nth]
    node.target = inplace
    gm.recompile()
    return gm


def test_checker_accepts_functional_and_safe_inplace_graphs():
    gm = _graph(lambda x: (torch.exp(x * 2) + 1).sum(), (3,))
    assert find_mutation_problems(gm) == []
    assert find_mutation_problems(reinplace_ops(gm)) == []
    assert any(n.target is aten.add_.Tensor for n in gm.graph.nodes)


def test_checker_catches_stale_read():
    def fn(x):
        a = x * 2
        b = a + 1  # planted in place: a is read again below
        return b * a

    gm = _plant(_graph(fn, (3,)), aten.add.Tensor, aten.add_.Tensor)
    with pytest.raises(MutationError, match="reads mul"):
        check_mutations(gm)


def test_checker_catches_overwritten_saved_output():
    def fn(x):
        a = torch.sin(x)
        return torch.cos(a), a  # `a` is returned (a saved value): cos must not overwrite it

    gm = _plant(_graph(fn, (3,)), aten.cos.default, aten.cos_.default)
    assert any("output reads sin" in p for p in find_mutation_problems(gm))


def test_checker_catches_unmutated_input_write_and_allows_mutated_one():
    gm = _plant(_graph(lambda x, y: (x * 0.9, y * 2), (3,), (3,)), aten.mul.Tensor,
                aten.mul_.Tensor)
    with pytest.raises(MutationError, match="writes graph input x_1"):
        check_mutations(gm)
    gm.meta[MUTABLE_INPUTS] = {"x_1": 0}  # the program mutates x; its new value is output 0
    assert find_mutation_problems(gm) == []
    gm.meta[MUTABLE_INPUTS] = {"x_1": 1}  # ... but output 0 may not share x's buffer
    assert any("shares the buffer of mutated input x_1" in p for p in find_mutation_problems(gm))


def test_checker_catches_overlapping_views():
    gm = _plant(_graph(lambda x: (x * 1) + (x * 1).t(), (3, 3)), aten.add.Tensor,
                aten.add_.Tensor)
    mul, mul_1 = [n for n in gm.graph.nodes if n.target is aten.mul.Tensor]
    mul_1.replace_all_uses_with(mul)  # now add_(mul, t(mul)): reads a view it overwrites
    gm.graph.erase_node(mul_1)
    gm.recompile()
    assert any("another view of it" in p for p in find_mutation_problems(gm))


def test_checker_catches_a_broken_reinplacer(monkeypatch):
    """Reinplacing that ignores later readers must be caught on realistic graphs."""
    module = sys.modules["trainc.passes.reinplace_ops"]
    monkeypatch.setattr(module, "_no_later_reader", lambda *a: True)
    caught = 0
    for seed in range(6):
        for gm in _split(random_program(seed), seed):
            caught += bool(find_mutation_problems(reinplace_ops(copy_gm(gm))))
    assert caught >= 3


def test_debug_flag_runs_checker_in_pipeline(monkeypatch):
    def plant(gm):
        return _plant(gm, aten.mul.Tensor, aten.mul_.Tensor)  # primals are never mutable here

    prog = random_program(1)
    prog.steps = [("mul", (0, 1))]
    monkeypatch.setattr(pipeline, "POST_GRAD_PASSES", [plant])
    args = program_inputs(1)
    kinds = [InputKind.USER] * 4 + [InputKind.BUFFER]
    with pytest.raises(MutationError):
        pipeline.compile_graph(traced(prog), args, kinds, True,
                               make_config(backend="aten", check_mutations=True))
    pipeline.compile_graph(traced(prog), args, kinds, True, make_config(backend="aten"))
