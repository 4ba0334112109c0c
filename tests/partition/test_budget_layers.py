"""Budgets between 0 and 1 on repeated layers: intermediate plans (some layers' activations saved,
the others recomputed), a predicted peak that falls monotonically with the budget, and the LM-head
loss chunked only where no plan of the whole graph meets the cap."""
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import trainc
from partition_helpers import joint_of, split
from trainc import chunked_loss, partition, records
from trainc.partition import budget as B

SWEEP = (None, 1.0, 0.9, 0.75, 0.6, 0.5, 0.4, 0.25, 0.1, 0.0)


def _layers_joint(layers=4, batch=256, width=256, hidden=1024):
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(width, hidden, generator=g, requires_grad=True) for _ in range(layers)]
    vs = [torch.randn(hidden, width, generator=g, requires_grad=True) for _ in range(layers)]
    x = torch.randn(batch, width, generator=g, requires_grad=True)

    def f(x, ws, vs):
        for w, v in zip(ws, vs):
            x = x + F.gelu(F.layer_norm(x, (width,)) @ w) @ v
        return x

    args = ", ".join(f"w{i}" for i in range(2 * layers))
    g4 = eval(f"lambda x, {args}: f(x, [{args}][:{layers}], [{args}][{layers}:])", {"f": f})
    return joint_of(g4, x, *ws, *vs)


def test_half_budget_lands_strictly_between_budget_zero_and_the_default():
    """The sweep alone cut all 4 layers alike: 0.5 planned like 0.0 (the 16-layer Llama on the
    H200: same plan, same measured peak at both)."""
    joint = _layers_joint()
    default, half, low = split(joint), split(joint, memory_budget=0.5), \
        split(joint, memory_budget=0.0)
    assert low.memory.peak < half.memory.peak < default.memory.peak
    assert low.recompute_flops > half.recompute_flops > default.recompute_flops
    cap = low.memory.peak + 0.5 * (default.memory.peak - low.memory.peak)
    assert half.memory.peak <= cap


def test_predicted_peak_falls_monotonically_over_a_sweep():
    joint = _layers_joint(layers=4)
    peaks = [split(joint, memory_budget=b).memory.peak for b in SWEEP]
    assert all(a >= b for a, b in zip(peaks, peaks[1:])), peaks
    assert len(set(peaks)) >= 4, peaks  # the frontier has points between its ends


class _LM(torch.nn.Module):
    def __init__(self, vocab=512, width=32, layers=3):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
            for _ in range(layers))
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, ids, tgt):
        x = self.emb(ids)
        for b in self.blocks:
            x = x + b(x)
        logits = self.head(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))


def _lm_plans(monkeypatch, budgets, **options):
    monkeypatch.setattr(chunked_loss, "CHUNK_BYTES", 64 * 512 * 4)  # 64 rows a chunk
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 512, (4, 128), generator=g)
    tgt = torch.randint(0, 512, (4, 128), generator=g)
    out = {}
    for b in budgets:
        torch._dynamo.reset()
        with partition.observing() as parts, records.recording() as recs:
            trainc.compile(_LM(), backend="aten", memory_budget=b, **options)(ids, tgt).backward()
        out[b] = parts[0].memory.peak, recs[0].chunked_losses
    return out


def test_chunk_loss_is_a_choice_of_the_budget(monkeypatch):
    """Under a budget, trainc.compile plans both the graph and its chunked-loss rewrite and keeps
    the plan the cap asks for: budget 0 reaches the lower of the two lowest peaks, no budget
    never chunks, and the chosen peak falls with the budget across the switch."""
    plans = _lm_plans(monkeypatch, (None, 0.5, 0.0))
    forced = {c: _lm_plans(monkeypatch, (0.0,), chunk_loss=c)[0.0] for c in (False, True)}
    assert forced[True][1] == 1 and forced[False][1] == 0
    assert plans[None][1] == 0
    assert plans[0.0][0] == min(forced[True][0], forced[False][0]), (plans, forced)
    assert plans[0.0][1] == int(forced[True][0] < forced[False][0])
    peaks = [plans[b][0] for b in (None, 0.5, 0.0)]
    assert all(a >= b for a, b in zip(peaks, peaks[1:])), plans


def test_offload_mix_saves_the_first_layers_as_the_default_plan_and_recomputes_the_last():
    """budget.early_saved (the search's plans where saved values may move to host memory): the
    first k of 8 steps of the forward cut as the default plan, the rest as a lean plan has it.
    k = 0 is the lean plan, k = 8 the default's saved values; at k = 4 less is recomputed and
    more saved than the lean plan, the first layer's activations saved, the last's recomputed."""
    from trainc.partition.cost import CostModel
    from trainc.partition import policy as P
    from trainc.partition.mincut_choose import budget_plans, default_saved
    joint = _layers_joint(layers=4)
    costs = CostModel(joint.gm, P.DEFAULT_POLICY, fuses=True)
    default = B.evaluate(joint, costs, default_saved(joint, costs), "default")
    lean = B.ladder(budget_plans(joint, costs, default), default)[0]
    assert lean.recompute_cost > default.recompute_cost
    mixes = [B.early_saved(joint, costs, lean, k, 8) for k in range(9)]
    assert set(mixes[0].saved) == set(lean.saved)
    assert set(mixes[8].saved) == set(default.saved)
    assert mixes[4].recompute_cost < mixes[0].recompute_cost
    assert mixes[0].memory.saved_bytes < mixes[4].memory.saved_bytes
    half = {n.name for n in mixes[4].saved}
    # the forward's matmuls, two a layer: x @ w (its output feeds gelu), then @ v
    from trainc.partition.split import tangent_dependent
    backward = tangent_dependent(joint.gm)
    mms = [n.name for n in joint.gm.graph.nodes
           if n.target is torch.ops.aten.mm.default and n not in backward]
    assert len(mms) == 8 and {mms[0], mms[6]} <= {n.name for n in default.saved}
    assert mms[0] in half and mms[6] not in half, (mms, sorted(half))


class _FakeOffload:
    """An offload predictor (the shape of trainc.offloading.BudgetOffload): a plan's peak with
    the most moved is its simulated peak less what a link of `link` bytes moves of its saved
    activations."""

    def __init__(self, link):
        self.link = link

    def __call__(self, plan):
        return plan.memory.peak - min(plan.memory.saved_bytes, self.link)

    def base(self, plan):
        return plan.memory.peak

    def limit(self, plan):
        return "fake link"

    def offload(self, plan, cap):
        return (), self(plan)


def test_budget_with_offload_takes_a_mix_whose_first_layers_are_saved_when_it_fits():
    """Where values move, a mix of the chosen rung with its first layers cut as the default
    plan has less recompute; the search takes it when its prediction fits the cap, and the
    table (21_budget_search.txt) lists every mix it predicted."""
    from trainc.config import make_config
    from trainc.partition.variants import partition_variants
    part = partition_variants([_layers_joint(layers=4)], make_config(memory_budget=0.5),
                              lambda joint, costs: _FakeOffload(link=1 << 20))[1]
    cap = float(part.search.split()[1])
    rows = [(r.startswith("*"), *r.lstrip("*").split()[1:6]) for r in
            part.search.splitlines()[2:]]  # (chosen, rung, recompute, GFLOP, simulated, predicted)
    chosen = [r for r in rows if r[0]]
    ladder_fits = [int(r[2]) for r in rows if r[1] != "m" and float(r[5]) <= cap]
    assert len(chosen) == 1 and chosen[0][1] == "m", part.search
    assert ladder_fits and int(chosen[0][2]) < min(ladder_fits), part.search
    assert float(chosen[0][5]) <= cap
