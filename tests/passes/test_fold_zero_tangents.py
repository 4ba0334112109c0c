"""passes/zero_tangents.py, one rule at a time: graphs traced with make_fx, a placeholder
marked zero, the folded graph's ops and values checked (against a zero tangent the folded
graph never reads, as eager's None gradient runs nothing)."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from trainc.passes import ZERO_FOLDS, fold_zero_tangents

aten = torch.ops.aten


def _fold(fn, *args, zero=-1):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return fold_zero_tangents(gm, [names[zero]])


def _ops(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def _check(fn, *args, zero=-1, gone=(), kept=()):
    gm = _fold(fn, *args, zero=zero)
    assert not _ops(gm) & set(gone), gm.graph
    assert set(kept) <= _ops(gm), gm.graph
    zeros = list(args)
    zeros[zero] = torch.zeros_like(args[zero])
    got, exp = gm(*zeros), fn(*zeros)
    for g, e in zip(got if isinstance(got, (tuple, list)) else [got],
                    exp if isinstance(exp, (tuple, list)) else [exp]):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e)
    return gm


x, w, z = torch.randn(4, 8), torch.randn(8, 3), torch.randn(4, 3)


def test_matmuls_of_a_zero_vanish():
    gm = _check(lambda w, z: (z @ w.t(), z.t() @ torch.ones(4, 2)), w, z, gone=[aten.mm.default])
    assert {str(n.target) for n in gm.graph.nodes if n.op == "call_function"} == \
        {"aten.full.default"}  # the outputs, as dense zeros
    _check(lambda a, z: torch.bmm(a, z), torch.randn(2, 3, 4), torch.randn(2, 4, 5),
           gone=[aten.bmm.default])


def test_add_of_a_zero_is_the_other_operand():
    gm = _check(lambda x, w, z: x + z @ w.t(), x, w, z, gone=[aten.mm.default, aten.add.Tensor])
    assert str(gm.meta[ZERO_FOLDS]).count("forwarded") == 1
    _check(lambda x, w, z: z @ w.t() + x, x, w, z, gone=[aten.add.Tensor])
    _check(lambda x, z: x - z, x, x.clone(), gone=[aten.sub.Tensor])
    # broadcasting: the other operand is not the result, so the add stays on dense zeros
    _check(lambda b, z: b + z, torch.randn(3), z, kept=[aten.add.Tensor, aten.full.default])


def test_views_sums_and_casts_of_a_zero_vanish():
    _check(lambda x, z: (z.view(-1).sum(0), z.t().unsqueeze(0).double().sum([0, 1]) + x.sum()),
           x, z, gone=[aten.view.default, aten.sum.dim_IntList, aten._to_copy.default])


def test_products_are_zero_whatever_the_other_factor():
    """x * 0 is nan for x = inf, but eager with a None gradient computes no product at all."""
    gm = _fold(lambda x, z: (x * z).sum(0), x, x.clone())
    inf = torch.full((4, 8), float("inf"))
    assert aten.mul.Tensor not in _ops(gm)
    assert torch.equal(gm(inf, torch.zeros(4, 8)), torch.zeros(8))


def test_backward_formulas_linear_in_grad_output():
    _check(lambda x, z: aten.threshold_backward(z, x, 0.0), x, x.clone(),
           gone=[aten.threshold_backward.default])
    _check(lambda x, z: aten._log_softmax_backward_data(z, x, 1, torch.float32), x, x.clone(),
           gone=[aten._log_softmax_backward_data.default])
    # zero as the saved input, not grad_output: not linear in it, kept
    _check(lambda g, z: aten.threshold_backward(g, z, 0.0), x, x.clone(),
           kept=[aten.threshold_backward.default])


def test_addmm_with_a_zero_factor_is_its_bias():
    b = torch.randn(4, 3)
    _check(lambda b, w, z: torch.addmm(b, z, w), b, torch.randn(8, 3), x,
           gone=[aten.addmm.default])


def test_where_and_cat_of_zeros():
    _check(lambda x, z: torch.where(x > 0, z, torch.zeros(4, 8)), x, x.clone(),
           gone=[aten.where.self])
    _check(lambda z: torch.cat([z, z * 2]), x, gone=[aten.cat.default])
    _check(lambda x, z: torch.cat([x, z]), x, x.clone(), kept=[aten.cat.default])


def test_split_items_of_a_zero_vanish():
    gm = _check(lambda x, z: [a + b for a, b in zip(z.split(2), x.split(2))], x, x.clone(),
                gone=[aten.add.Tensor])
    assert [n.args[0].name for n in gm.graph.nodes if n.target is aten.split.Tensor] == ["x_1"]


def test_unknown_op_reads_dense_zeros():
    """No rule for the divisor of a division: it gets a materialized zeros, as traced."""
    gm = _check(lambda x, z: x / z, x, x.clone(), kept=[aten.div.Tensor, aten.full.default])
    assert gm.meta[ZERO_FOLDS].materialized == ["z_1"]


def test_unknown_placeholder_name_is_an_error():
    gm = make_fx(lambda a: a + 1, tracing_mode="fake")(x)
    with pytest.raises(ValueError, match="no placeholders named"):
        fold_zero_tangents(gm, ["nope"])


def test_a_list_of_zeros_read_whole_is_kept():
    """split's list given whole to cat (make_fx unpacks it; another tracer need not)."""
    gm = make_fx(lambda x, z: torch.cat(z.split(2)) + x, tracing_mode="fake")(x, x.clone())
    split = next(n for n in gm.graph.nodes if n.target is aten.split.Tensor)
    cat = next(n for n in gm.graph.nodes if n.target is aten.cat.default)
    cat.args = (split,)
    gm.graph.eliminate_dead_code()
    gm = fold_zero_tangents(gm, ["z_1"])
    assert {aten.split.Tensor, aten.cat.default} <= _ops(gm)
    assert gm.meta[ZERO_FOLDS].materialized == ["z_1"]
    torch.testing.assert_close(gm(x, torch.zeros(4, 8)), x)
