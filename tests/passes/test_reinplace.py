"""Post-grad reinplacing: same values bit for bit with the pass on and off (graph level and end
to end through the runtime, against a float64 eager oracle), every rewritten graph passes the
mutation checker, and the shared models' backward graphs lose their full-size copies."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pass_programs import (Program, bitwise_equal, copy_gm, input_kinds, program_inputs,
                           random_program, real_inputs, run_graph, traced)
from trainc import pipeline, runtime
from trainc.config import make_config
from trainc.joint import trace_joint
from trainc.partition import partition
from trainc.passes import (JOINT_PASSES, POST_GRAD_PASSES, check_mutations, mark_mutable_inputs,
                           run_passes)
from trainc.passes.reinplace_ops import MUTABLE_INPUTS, REINPLACED, reinplace_ops
from trainc.testing import compare

aten = torch.ops.aten


def _split(prog: Program, seed: int):
    joint = trace_joint(traced(prog), program_inputs(seed), input_kinds(), True)
    joint = dataclasses.replace(joint, gm=run_passes(joint.gm, JOINT_PASSES))
    part = partition(joint, make_config(backend="aten"))
    return mark_mutable_inputs(part.fwd, joint.signature), part.bwd


def assert_reinplace_keeps_values(gm, seed: int = 0) -> torch.fx.GraphModule:
    """Run `gm` before and after reinplacing on the same inputs: outputs bitwise equal, inputs
    untouched except program-mutated ones (the runtime overwrites those from their slot)."""
    inputs = real_inputs(gm, seed)
    n_out = len(gm.graph.output_node().args[0])
    before = run_graph(gm, inputs)
    after_gm = check_mutations(reinplace_ops(copy_gm(gm)))
    after = run_graph(after_gm, inputs)
    assert bitwise_equal(before[:n_out], after[:n_out]), "outputs changed"
    mutable = after_gm.meta.get(MUTABLE_INPUTS, {})
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    for i, name in enumerate(names):
        if name not in mutable:
            assert bitwise_equal([before[n_out + i]], [after[n_out + i]]), f"{name} was written"
    return after_gm


@pytest.mark.parametrize("seed", range(16))
def test_reinplace_keeps_values_on_random_programs(seed):
    fwd, bwd = _split(random_program(seed), seed)
    for gm in (fwd, bwd):
        assert_reinplace_keeps_values(gm, seed)


def test_reinplace_rewrites_scatters_and_accumulation():
    found: set = set()
    total = 0
    for seed in range(16):
        prog = random_program(seed)
        prog.steps += [("slice", (0,)), ("setcol", (1,)), ("add", (0, 1)), ("mul", (0, 2))]
        prog.gather = True
        for gm in _split(prog, seed):
            gm = assert_reinplace_keeps_values(gm, seed)
            found |= {n.target for n in gm.graph.nodes}
            total += gm.meta[REINPLACED]
    assert total > 50
    for op in (aten.index_put_.default, torch.ops.trainc.slice_scatter_.default,
               aten.add_.Tensor, aten.mul_.Tensor, aten.where.self_out):
        assert op in found, op


def _make(fn, *examples) -> torch.fx.GraphModule:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        return make_fx(fn)(*[mode.from_tensor(e) for e in examples])


def test_reinplace_scatter_family_and_refusals():
    idx = torch.tensor([0, 2, 2])

    def fn(x, v, s):
        z = torch.zeros(4, 3)
        a = torch.ops.aten.index_put.default(z, [idx], v, True)
        b = torch.ops.aten.select_scatter.default(a * 2, s, 1, 0)
        c = torch.ops.aten.slice_scatter.default(b + 1, v[:2], 0, 1, 3)
        d = torch.ops.aten.scatter.src(c.exp(), 0, idx.view(3, 1).expand(3, 3), v)
        e = torch.ops.aten.index_put.default(x, [idx], v)  # x is a graph input: never written
        f = torch.ops.aten.slice_scatter.default(c, v[:1], 0, 0, 1)  # c is read later: copy
        return d, e, f + c * 1

    ex = (torch.randn(4, 3), torch.randn(3, 3), torch.randn(4))
    gm = _make(fn, *ex)
    after = assert_reinplace_keeps_values(gm)
    targets = [n.target for n in after.graph.nodes]
    for op in (aten.index_put_.default, torch.ops.trainc.select_scatter_.default,
               torch.ops.trainc.slice_scatter_.default, aten.scatter_.src, aten.add_.Tensor):
        assert op in targets, op
    assert targets.count(aten.index_put.default) == 1  # the one into input x
    assert targets.count(aten.slice_scatter.default) == 1  # the one whose base is read later
    assert aten.exp.default in targets  # c.exp(): c is read later


def _compiled(prog: Program, seed: int, passes_on: bool, monkeypatch):
    if not passes_on:
        monkeypatch.setattr(pipeline, "JOINT_PASSES", [])
        monkeypatch.setattr(pipeline, "POST_GRAD_PASSES", [])
    args = program_inputs(seed)
    config = make_config(backend="aten", check_mutations=passes_on)
    art = pipeline.compile_graph(traced(prog), args, input_kinds(), True, config)
    monkeypatch.undo()
    return art


def _run(art, prog: Program, seed: int, double: bool = False) -> list:
    """Outputs, grads of x0..x2 and the buffer after one call (eager when `art` is None)."""
    args = program_inputs(seed)
    if double:
        args = [a.detach().double().requires_grad_(a.requires_grad) if a.is_floating_point()
                else a for a in args]
    torch.manual_seed(7)
    outs = runtime.run(art, args) if art is not None else list(prog(*args))
    loss = sum((o * (k + 1)).sum() for k, o in enumerate(outs))
    grads = torch.autograd.grad(loss, args[:3], allow_unused=True)
    return [o.detach() for o in outs] + list(grads) + [args[-1]]


@pytest.mark.parametrize("seed", range(8))
def test_passes_end_to_end_bitwise_and_oracle(seed, monkeypatch):
    prog = random_program(seed)
    on = _compiled(prog, seed, True, monkeypatch)
    off = _compiled(prog, seed, False, monkeypatch)
    got = _run(on, prog, seed)
    assert bitwise_equal(got, _run(on, prog, seed)), "two runs differ"
    assert bitwise_equal(got, _run(off, prog, seed)), "passes changed the results"
    if prog.random:
        return  # eager draws other random numbers: the on/off comparison is the check
    eager, ref = _run(None, prog, seed), _run(None, prog, seed, double=True)
    for k, (c, e, r) in enumerate(zip(got, eager, ref)):
        assert compare(f"value {k}", c, e, r) is None


@pytest.mark.parametrize("backend", ["aten", "cpp"])
def test_split_pieces_of_an_input_are_views_not_buffers_to_overwrite(backend):
    """split/chunk/unbind return `Tensor(a)[]`, a list the schema gives no alias set: their
    pieces were taken for fresh buffers, and a pointwise op on a piece of a graph input was
    rewritten to write into the user's tensor (aten) or refused by codegen (cpp)."""
    import trainc

    def f(x, t):
        a, b = t.view(-1).split([3, 5])
        return x * torch.where(a != 2, a, 0).sum() + torch.where(b != 1, b, 0).sum()
    torch._dynamo.reset()
    x, t = torch.randn(4, requires_grad=True), torch.tensor([[2, 2, 1, 1], [1, 2, 3, 4]])
    t0 = t.clone()
    out = trainc.compile(f, backend=backend)(x, t)
    out.sum().backward()
    assert torch.equal(t, t0), "the input was written"
    torch.testing.assert_close(out, f(x, t0))
