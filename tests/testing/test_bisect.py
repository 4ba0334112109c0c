"""trainc.testing.bisect on planted faults: a pass, the partition, a kernel's lowering, the
backend's wrapper and a decomposition each made wrong; the bisector must name that stage, and
its repro script must fail with the culprit's options and pass with the stage before."""
import functools
import re
import runpy

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from trainc import passes as P
from trainc.codegen import ir
from trainc.codegen.lowerings import LOWERINGS
from trainc.codegen.lowerings.common import pointwise
from trainc.partition import PARTITIONERS
from trainc.testing import bisect

aten = torch.ops.aten


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(nn.functional.gelu(self.a(x))).tanh()


def _case():
    torch.manual_seed(0)
    return Net(), [torch.randn(4, 8)]


def _scale_first(gm: fx.GraphModule, target, by: float = 1.5) -> fx.GraphModule:
    """The first `target` node's result times `by` for every reader: a wrong graph."""
    node = next((n for n in gm.graph.nodes if n.target is target), None)
    if node is not None:
        with gm.graph.inserting_after(node):
            wrong = gm.graph.call_function(aten.mul.Tensor, (node, by))
        node.replace_all_uses_with(wrong, delete_user_cb=lambda u: u is not wrong)
        wrong.meta = dict(node.meta)
        gm.recompile()
    return gm


def _wrong_constant(gm: fx.GraphModule) -> None:
    """The first float multiplier of the graph changed in place (no new node: costs hold)."""
    node = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor
                and isinstance(n.args[1], float))
    node.args = (node.args[0], node.args[1] * 1.5)
    gm.recompile()


def _wrong_pass(real, target):
    @functools.wraps(real)
    def wrong(gm):
        return _scale_first(real(gm), target)
    return wrong


@pytest.fixture
def restore_passes():
    saved = list(P.JOINT_PASSES), list(P.POST_GRAD_PASSES)
    yield
    P.JOINT_PASSES[:], P.POST_GRAD_PASSES[:] = saved


def _replace_pass(passes, name, target):
    i = next(i for i, p in enumerate(passes) if p.__name__ == name)
    passes[i] = _wrong_pass(passes[i], target)


def _bisect(tmp_path, **options):
    model, inputs = _case()
    return bisect(model, inputs, repro_path=str(tmp_path / "repro.py"), verbose=False, **options)


def _repro_fails_at_culprit_only(path):
    main = runpy.run_path(path, run_name="repro")["main"]
    assert main() == 1  # passes with the stage before (raises otherwise), fails at the culprit


def test_clean_case_has_nothing_to_bisect(tmp_path):
    result = _bisect(tmp_path, backend="cpp")
    assert result.stage is None and result.repro is None


def test_names_a_wrong_joint_pass(restore_passes, tmp_path):
    _replace_pass(P.JOINT_PASSES, "fold_constants", aten.erf.default)
    result = _bisect(tmp_path, backend="cpp")
    assert (result.stage.kind, result.stage.name) == ("joint pass", "fold_constants")
    assert (result.passing.kind, result.passing.name) == ("joint pass", "remove_noops")
    _repro_fails_at_culprit_only(result.repro)


def test_names_a_wrong_post_grad_pass(restore_passes, tmp_path):
    _replace_pass(P.POST_GRAD_PASSES, "pad_matmuls", aten.tanh.default)
    result = _bisect(tmp_path, backend="cpp")
    assert (result.stage.kind, result.stage.name) == ("post-grad pass", "pad_matmuls")
    _repro_fails_at_culprit_only(result.repro)


def test_names_a_wrong_partitioner(monkeypatch, tmp_path):
    real = PARTITIONERS["mincut"]

    def wrong(joint, costs, config):
        _wrong_constant(joint.gm)
        return real(joint, costs, config)
    monkeypatch.setitem(PARTITIONERS, "mincut", wrong)
    result = _bisect(tmp_path, backend="cpp")
    assert (result.stage.kind, result.stage.name) == ("partition", "mincut")
    _repro_fails_at_culprit_only(result.repro)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_names_a_wrong_kernel(monkeypatch, tmp_path, backend):
    real = LOWERINGS[aten.exp.default]

    def wrong_exp(ctx, node, x):  # 1.5 exp(x)
        right = real(ctx, node, x)
        return pointwise(node, lambda a: ir.op("mul", a.dtype, a, ir.Const(1.5, a.dtype)), right)
    monkeypatch.setitem(LOWERINGS, aten.exp.default, wrong_exp)
    result = _bisect(tmp_path, backend=backend)
    assert result.stage.kind == "kernel", result
    assert re.match(r"generated code for exp\w*:", result.stage.name), result.stage.name
    _repro_fails_at_culprit_only(result.repro)
