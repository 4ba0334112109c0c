"""trainc.policy regions (#11 item 4): tags reach the joint graph, the partitioner honours them
(with and without a budget, in trainc.compile and compile_step), explain() shows the rule, and
gradients still match a float64 eager run."""
import copy

import pytest
import torch
import torch.nn.functional as F

import trainc
from partition_helpers import capture_joints, split
from policy import assert_policy
from trainc import records, regions
from trainc.cache_key import make_key
from trainc.config import make_config
from trainc.partition import SavePolicy


class Block(torch.nn.Module):
    """Three linears; the middle one's pointwise tail inside a trainc.policy region."""

    def __init__(self, tag=None, width=64):
        super().__init__()
        self.tag = tag
        self.l1, self.l2, self.l3 = (torch.nn.Linear(width, width) for _ in range(3))

    def forward(self, x):
        x = torch.tanh(self.l1(x))
        if self.tag is None:
            y = self.l2(x).sin().cos() * x
        else:
            with trainc.policy(self.tag):
                y = self.l2(x).sin().cos() * x
        return F.gelu(self.l3(y)).sum()


def _region_nodes(joint):
    return {n.name for n in joint.gm.graph.nodes if regions.tag_of(n) is not None}


def _decisions(model, x, **options):
    torch._dynamo.reset()
    e = trainc.explain(model, x, **options)
    assert len(e.graphs) == 1
    return {d.name: d for d in e.graphs[0].decisions}, e


def test_region_tags_reach_the_joint_graph(monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(8, 64, requires_grad=True)
    joint, = capture_joints(monkeypatch, Block("recompute"), (x,))
    tagged = {n.target.__name__.split(".")[0] for n in joint.gm.graph.nodes
              if regions.tag_of(n) == "recompute"}
    assert {"addmm", "sin", "cos", "mul"} <= tagged
    untagged = [n for n in joint.gm.graph.nodes if n.op == "call_function"
                and "tanh" in str(n.target) and regions.tag_of(n) is None]
    assert untagged, "the tanh before the region must stay untagged"
    torch._dynamo.reset()
    plain, = capture_joints(monkeypatch, Block(None), (x,))
    assert not _region_nodes(plain)


@pytest.mark.parametrize("backend", ["aten", "cpp"])
def test_recompute_region_is_recomputed(backend):
    torch.manual_seed(0)
    x = torch.randn(32, 64, requires_grad=True)
    plain, _ = _decisions(Block(None), x, backend=backend)
    tagged, e = _decisions(Block("recompute"), x, backend=backend)
    region = [d for d in tagged.values() if "trainc.policy('recompute')" in d.rule]
    assert region and all(d.action == "recomputed" for d in region)
    # the region's matmul is expensive: only the policy makes the backward recompute it
    mm = [d for d in region if "addmm" in d.op]
    assert mm and not any(d.name in plain and plain[d.name].action == "recomputed" for d in mm)
    assert e.recompute_flops > sum(d.recompute_flops for d in plain.values())
    assert "trainc.policy('recompute') region" in e.table(per_value=True)


@pytest.mark.parametrize("backend", ["aten", "cpp"])
def test_save_region_is_saved(backend):
    torch.manual_seed(0)
    x = torch.randn(32, 64, requires_grad=True)
    plain, _ = _decisions(Block(None), x, backend=backend)
    tagged, e = _decisions(Block("save"), x, backend=backend)
    region = [d for d in tagged.values() if "trainc.policy('save')" in d.rule]
    assert region and all(d.action == "saved" for d in region)
    assert not any(d.action == "recomputed" and d.name in {r.name for r in region}
                   for d in tagged.values())
    # without the policy the bytes objective (aten's) recomputes at least one of them
    assert backend == "cpp" or any(plain.get(d.name) is None or plain[d.name].action == "recomputed"
               for d in region)


@pytest.mark.parametrize("backend", ["aten", "cpp"])
@pytest.mark.parametrize("tag", ["save", "recompute"])
def test_region_gradients_match_float64(backend, tag):
    torch.manual_seed(0)
    model = Block(tag)
    x = torch.randn(16, 64, requires_grad=True)

    def grads(m, fn, inp):
        inp = inp.detach().requires_grad_(True)
        loss = fn(inp)
        loss.backward()
        return [loss.detach(), inp.grad] + [p.grad for p in m.parameters()]

    ref_m = copy.deepcopy(model).double()
    ref = grads(ref_m, ref_m, x.double())
    eager_m = copy.deepcopy(model)
    eager = grads(eager_m, eager_m, x)
    torch._dynamo.reset()
    comp_m = copy.deepcopy(model)
    comp = grads(comp_m, trainc.compile(comp_m, backend=backend), x)
    for i, (c, e, r) in enumerate(zip(comp, eager, ref)):
        assert_policy(f"{tag}/{backend} value {i}", c, e, r)


def test_illegal_recompute_is_saved_with_the_reason():
    """An op the save policy never recomputes stays saved inside a recompute region."""
    torch.manual_seed(0)
    x = torch.randn(32, 64, requires_grad=True)
    never = SavePolicy(never=frozenset({"aten.sin"}))
    tagged, _ = _decisions(Block("recompute"), x, backend="aten", policy=never)
    sin = [d for d in tagged.values() if "sin" in d.op]
    assert sin and all(d.action == "saved" and "cannot be recomputed" in d.rule for d in sin)


@pytest.mark.parametrize("budget", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("tag", ["save", "recompute"])
def test_budgets_honour_regions(monkeypatch, budget, tag):
    torch.manual_seed(0)
    x = torch.randn(64, 64, requires_grad=True)
    joint, = capture_joints(monkeypatch, Block(tag), (x,))
    part = split(joint, memory_budget=budget)
    want = "saved" if tag == "save" else "recomputed"
    region = [d for d in part.decisions if f"trainc.policy('{tag}')" in d.rule]
    assert region and all(d.action == want for d in region), part.decisions
    tagged = {n.name for n in joint.gm.graph.nodes if regions.tag_of(n) == tag}
    if tag == "recompute":
        assert not tagged & {d.name for d in part.decisions if d.action == "saved"}
    else:
        assert not tagged & {d.name for d in part.decisions if d.action == "recomputed"}


def test_unknown_policy_name():
    with pytest.raises(ValueError, match="unknown policy 'keep'"):
        trainc.policy("keep")


def test_policy_is_a_no_op_in_eager():
    torch.manual_seed(0)
    model = Block("recompute")
    x = torch.randn(4, 64)
    plain = copy.deepcopy(model)
    plain.tag = None
    assert torch.equal(model(x), plain(x))


def test_cache_key_includes_region_tags(monkeypatch):
    x = torch.randn(8, 64, requires_grad=True)
    keys = {}
    for tag in ("save", "recompute", None):
        torch._dynamo.reset()
        joint, = capture_joints(monkeypatch, Block(tag), (x,))
        key, why = make_key(joint.gm, [x], ["user"], True, make_config())
        assert key is not None, why
        keys[tag] = key.digest
    assert len(set(keys.values())) == 3


@pytest.mark.parametrize("backend", ["aten", "cpp"])
@pytest.mark.parametrize("tag", ["save", "recompute"])
def test_compile_step_honours_regions(backend, tag):
    torch.manual_seed(0)
    model = Block(tag)
    x = torch.randn(16, 64)

    def eager_step(m, b):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        loss = m(b)
        loss.backward()
        opt.step()
        return [loss.detach(), *[p.detach() for p in m.parameters()]]

    ref = eager_step(copy.deepcopy(model).double(), x.double())
    eager = eager_step(copy.deepcopy(model), x)
    comp_m = copy.deepcopy(model)
    step = trainc.compile_step(comp_m, lambda m, b: m(b),
                               torch.optim.SGD(comp_m.parameters(), lr=0.1), backend=backend)
    with records.recording() as recs:
        loss = step(x)
    comp = [loss, *[p.detach() for p in comp_m.parameters()]]
    for i, (c, e, r) in enumerate(zip(comp, eager, ref)):
        assert_policy(f"step {tag}/{backend} value {i}", c, e, r)
    want = "saved" if tag == "save" else "recomputed"
    region = [d for d in recs[0].decisions if f"trainc.policy('{tag}')" in d.rule]
    assert region and all(d.action == want for d in region)
