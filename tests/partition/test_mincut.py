"""Min-cut partition on hand-made graphs: the saved set by name/count/bytes, and optimality."""
import itertools

import torch
import torch.nn.functional as F

from partition_helpers import joint_of, saved_activations, split
from trainc.partition import policy as P
from trainc.partition.cost import CostModel
from trainc.partition.mincut import saved_from_cut
from trainc.partition.mincut_choose import default_saved
from trainc.partition.split import joint_outputs, tangent_dependent


def test_pointwise_chain_saves_only_its_input():
    x = torch.randn(32, 16, requires_grad=True)
    part = split(joint_of(lambda x: (x.sin() * 2).exp().cos(), x))
    assert part.saved == ("primals_0",)
    assert saved_activations(part) == {}
    assert part.saved_bytes == 0
    assert part.recompute_flops > 0  # sin/exp/cos are rebuilt from x in the backward


def _saved_storages(part) -> set:
    return {d.storage for d in part.decisions if d.action == "saved" and not d.is_input}


def test_matmul_output_is_saved_not_recomputed():
    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(16, 32, requires_grad=True)
    v = torch.randn(32, 4, requires_grad=True)
    part = split(joint_of(lambda x, w, v: (x @ w) @ v, x, w, v))
    assert _saved_storages(part) == {"mm"}  # the grad of v reads mm's output (through a view)
    assert part.saved_bytes == 8 * 32 * 4
    assert "policy: aten.mm is expensive" in [d.rule for d in part.decisions
                                               if d.storage == "mm"][0]
    assert not any(d.op == "aten.mm.default" for d in part.decisions if d.action == "recomputed")
    # sin's backward reads cos(mm): one tensor of mm's size, saved rather than recomputing cos.
    part = split(joint_of(lambda x, w: (x @ w).sin(), x, w))
    assert saved_activations(part) == {"cos": 8 * 32 * 4}


def test_dropout_mask_is_recomputed_from_the_seed():
    x = torch.randn(64, 32, requires_grad=True)
    part = split(joint_of(lambda x: F.dropout(x.sin(), 0.3, True), x))
    assert "seed" in part.saved and saved_activations(part) == {}
    random = [d for d in part.decisions if d.op == "trainc.philox_uniform.default"]
    assert len(random) == 1 and random[0].action == "recomputed"
    assert "philox" in random[0].rule


def test_save_all_saves_more_than_mincut():
    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(16, 32, requires_grad=True)
    joint = joint_of(lambda x, w: F.gelu(x @ w).tanh(), x, w)
    assert split(joint, partitioner="save_all").saved_bytes > split(joint).saved_bytes


def test_user_policy_never_and_nothing_saveable():
    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(16, 32, requires_grad=True)
    joint = joint_of(lambda x, w: (x @ w).sin().exp(), x, w)
    # Default: one mm-sized tensor (mm) beats two (cos, exp); sin/cos/exp are recomputed.
    assert saved_activations(split(joint)) == {"mm": 1024}
    free = split(joint, policy=P.NOTHING_SAVEABLE)
    assert saved_activations(free) == {}  # mm may be recomputed: only inputs are saved
    assert any(d.op == "aten.mm.default" and d.action == "recomputed" for d in free.decisions)
    pinned = split(joint, policy=P.SavePolicy(never=frozenset({"aten.exp"})))
    assert saved_activations(pinned) == {"cos": 1024, "exp": 1024}


def _plan_cost(joint, costs, recompute, big):
    """Exhaustive search's objective: bytes first, recompute cost second (default mode)."""
    backward = tangent_dependent(joint.gm)
    _, grads = joint_outputs(joint)
    boundary = [n for n in joint.gm.graph.nodes if n not in backward and n.op != "output"
                and (n in grads or any(u in backward for u in n.users))]
    saved = saved_from_cut(joint, boundary, lambda n: n not in recompute)
    rebuilt, work = set(), [a for b in boundary if b not in saved for a in [b]]
    while work:
        n = work.pop()
        if n in rebuilt or n in saved:
            continue
        rebuilt.add(n)
        work.extend(n.all_input_nodes)
    if any(not costs.policy.recomputable(n, False) for n in rebuilt):
        return None
    return big * sum(costs[n].nbytes for n in saved) + sum(costs[n].recompute for n in rebuilt)


def test_mincut_equals_exhaustive_optimum_on_small_graph():
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)

    def f(x, w):
        return (torch.tanh(x @ w).exp() * x.sin()).sigmoid() + x.cos()

    joint = joint_of(f, x, w)
    costs = CostModel(joint.gm, P.DEFAULT_POLICY)
    backward = tangent_dependent(joint.gm)
    free = [n for n in joint.gm.graph.nodes if n.op == "call_function" and n not in backward
            and costs.policy.recomputable(n, False)]
    assert 8 <= len(free) <= 16, len(free)
    big = sum(c.recompute for c in costs.costs.values()) + 1
    best = min(c for r in range(len(free) + 1) for combo in itertools.combinations(free, r)
               if (c := _plan_cost(joint, costs, set(combo), big)) is not None)
    saved = set(default_saved(joint, costs))
    chosen = {n for n in free if n not in saved}
    assert _plan_cost(joint, costs, chosen, big) == best


def test_a_view_of_an_input_is_saved_as_the_input():
    """The backward reads w[:, None] (a view of a graph input): the input itself is saved and
    viewed again in the backward, so the forward returns no extra view per call."""
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    joint = joint_of(lambda x, w: (x * w[:, None]).sin(), x, w)
    for partitioner in ("mincut", "save_all"):
        part = split(joint, partitioner=partitioner)
        assert "primals_1" in part.saved
        views = [d for d in part.decisions if d.op.startswith(("aten.unsqueeze", "aten.slice"))]
        assert views and all(d.action == "recomputed" and "view of a graph input" in d.rule
                             for d in views), part.decisions
        outputs = next(n for n in part.fwd.graph.nodes if n.op == "output").args[0]
        assert not any(isinstance(o, torch.fx.Node) and o.op == "call_function"
                       and P.op_name(o).startswith(("aten.unsqueeze", "aten.slice"))
                       for o in outputs)
