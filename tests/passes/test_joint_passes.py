"""Joint-graph passes: each keeps the joint graph's values bit for bit on random programs, keeps
meta["val"] on every node, and does what it claims on targeted graphs."""
from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from pass_programs import (bitwise_equal, copy_gm, input_kinds, program_inputs, random_program,
                           real_inputs, run_graph, traced)
from trainc.joint import trace_joint
from trainc.passes import (JOINT_PASSES, Rewrite, eliminate_common_subexpressions,
                           fold_constants, register_rewrite, remove_dead_code, remove_noops,
                           rewrite_patterns)
from trainc.passes.rewrite_patterns import RULES

aten = torch.ops.aten


def _joint(seed: int):
    prog = random_program(seed)
    return trace_joint(traced(prog), program_inputs(seed), input_kinds(), True)


def _targets(gm: fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("seed", range(16))
def test_each_joint_pass_keeps_values_bitwise(seed):
    joint = _joint(seed)
    inputs = real_inputs(joint.gm, seed)
    want = run_graph(joint.gm, inputs)
    assert bitwise_equal(want, run_graph(joint.gm, inputs)), "two runs differ"
    gm = copy_gm(joint.gm)
    for p in dict.fromkeys(JOINT_PASSES):
        alone = p(copy_gm(joint.gm))
        assert bitwise_equal(want, run_graph(alone, inputs)), p.__name__
        gm = p(gm)  # and the whole pipeline, cumulatively
        gm.graph.lint()
        missing = [n.name for n in gm.graph.nodes if n.op not in ("output",)
                   and "val" not in n.meta]
        assert not missing, f"{p.__name__} left nodes without meta['val']: {missing}"
    assert bitwise_equal(want, run_graph(gm, inputs))
    assert len(gm.graph.nodes) <= len(joint.gm.graph.nodes)


def test_joint_passes_keep_constants_behind_their_copies():
    prog = random_program(3)
    prog.steps += [("const", (0,)), ("mul1", (-1,)), ("const", (-1,))]
    joint = trace_joint(traced(prog), program_inputs(3), input_kinds(), True)
    inputs = real_inputs(joint.gm)
    gm = copy_gm(joint.gm)
    for p in JOINT_PASSES:
        gm = p(gm)
    assert bitwise_equal(run_graph(joint.gm, inputs), run_graph(gm, inputs))
    consts = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert consts and all(u.target is aten.lift_fresh_copy.default
                          for n in consts for u in n.users)


def _trace(fn, *shapes, decompose: bool = True) -> fx.GraphModule:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from trainc.decomps import TABLE
    with FakeTensorMode():
        return make_fx(fn, decomposition_table=TABLE if decompose else None)(
            *[torch.empty(s) for s in shapes])


def test_cse_merges_duplicates_but_never_random_ops():
    def fn(x):
        seed = x.new_zeros((), dtype=torch.int64)
        a = torch.ops.trainc.philox_uniform(seed, 0, [4], torch.float32, x.device)
        b = torch.ops.trainc.philox_uniform(seed, 0, [4], torch.float32, x.device)
        r1, r2 = torch.rand_like(x), torch.rand_like(x)
        return torch.sin(x) + torch.sin(x), a + b, r1 + r2

    gm = eliminate_common_subexpressions(_trace(fn, (4,), decompose=False))
    targets = _targets(gm)
    assert targets.count(aten.sin.default) == 1
    assert targets.count(torch.ops.trainc.philox_uniform.default) == 2
    assert targets.count(aten.rand_like.default) == 2


def test_remove_noops_removes_identities_and_collapses_chains():
    def fn(x, y):
        a = (x * 1) / 1 - 0
        b = a.clone().to(torch.float32)
        c = b.view(24).view(2, 12).view(4, 6)
        d = c.permute(1, 0).permute(1, 0)
        e = torch.ops.aten.copy.default(d, y)  # y already has d's layout
        return (e + 0.0 + y).sum()  # float x + 0.0 stays: -0.0 + 0.0 is +0.0

    gm = remove_noops(_trace(fn, (4, 6), (4, 6)))
    targets = _targets(gm)
    for op in (aten.mul.Tensor, aten.div.Tensor, aten.sub.Tensor, aten.clone.default,
               aten._to_copy.default, aten.view.default, aten.permute.default, aten.copy.default):
        assert op not in targets, op
    assert targets.count(aten.add.Tensor) == 2
    x = torch.tensor([[-0.0] * 6] * 4)
    assert torch.equal(gm(x, x)[0] if isinstance(gm(x, x), (list, tuple)) else gm(x, x),
                       fn(x, x))


def test_remove_noops_keeps_outputs_own_buffers():
    def fn(x):
        return x * 1, x.clone()  # outputs must not become the input itself

    gm = remove_noops(_trace(fn, (3,)))
    outs = gm.graph.output_node().args[0]
    assert all(o.op == "call_function" for o in outs)


def test_fold_constants_folds_scalar_arithmetic():
    def fn(x):
        s = (x.new_ones(()) * 2 + 1) / 4
        return x * s, x * torch.ops.aten.sqrt.default(s * 4)

    gm = remove_dead_code(fold_constants(_trace(fn, (5,))))
    targets = _targets(gm)
    assert targets.count(aten.mul.Tensor) == 2 and aten.add.Tensor not in targets
    assert aten.div.Tensor not in targets and aten.sqrt.default not in targets
    x = torch.randn(5)
    got, want = gm(x), fn(x)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_rewrite_registry_applies_backend_rules():
    def pattern(x, y):
        return aten.add.Tensor(aten.mul.Tensor(x, y), x)

    def replacement(x, y):
        return aten.mul.Tensor(x, aten.add.Tensor(y, 1))

    rule = register_rewrite(pattern, replacement, name="x*y+x -> x*(y+1)")
    try:
        assert isinstance(rule, Rewrite) and rule in RULES
        gm = _trace(lambda a, b: a * b + a, (3,), (3,))
        gm = rewrite_patterns(gm)
        assert _targets(gm) == [aten.add.Tensor, aten.mul.Tensor]
        assert all("val" in n.meta for n in gm.graph.nodes if n.op != "output")
        a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, -1.0, 2.0])
        assert torch.allclose(gm(a, b), a * (b + 1))
    finally:
        RULES.remove(rule)


def test_rewrite_default_rules_and_layout_guard():
    gm = rewrite_patterns(_trace(lambda a: (-(-a)).t() * -1, (2, 3)))
    assert _targets(gm) == [aten.permute.default, aten.neg.default]
    mismatch = Rewrite("bad", fx.symbolic_trace(lambda x: aten.permute.default(x, [1, 0])).graph,
                       fx.symbolic_trace(lambda x: aten.clone.default(x)).graph)
    gm = rewrite_patterns(_trace(lambda a: a.t() + 1, (2, 3)), rules=[mismatch])
    assert aten.permute.default in _targets(gm), "a layout-changing rewrite must not apply"


def test_trace_joint_retraces_under_functionalization_only_graphs_that_write(monkeypatch):
    """The functionalizing second trace runs only when the first trace writes (an in-place or
    out= op): without one it would trace the same program again (CPU gpt: 0.3-0.4 s of a
    first call). Either way the joint graph mutates nothing."""
    import trainc.joint as J
    from trainc.graph import InputKind
    traces = []
    real = J.make_fx
    monkeypatch.setattr(J, "make_fx", lambda *a, **k: traces.append(1) or real(*a, **k))

    def pure(x):
        return (x * 2).sin()

    def writes(x):
        y = x * 2
        y.add_(1)
        return y.sin()
    for fn, n in ((pure, 1), (writes, 2)):
        traces.clear()
        joint = trace_joint(fx.symbolic_trace(fn), [torch.randn(4, requires_grad=True)],
                            [InputKind.USER], True)
        assert len(traces) == n and not J._writes(joint.gm)
