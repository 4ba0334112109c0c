"""Same decisions on every rank (trainc/decisions.py): 2 gloo processes on CPU.

Identical options: every compiled graph's decision hash is compared and agrees. A planted
difference (rank 1 compiles under another memory budget): RankMismatchError on both ranks,
naming the differing decision, and the group still works after it. A graph only rank 0
compiles: rank 0 names rank 1 after the store's timeout (shortened here) instead of hanging.
Harness: gloo_jobs.py (one pair of spawned processes runs every job).
"""
import datetime

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gloo_jobs
import trainc
from trainc import decisions, records

WORLD, TIMEOUT = 2, 120
pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="needs torch.distributed with gloo")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def loss_fn(model, x, y):
    return F.mse_loss(model(x), y)


def _model() -> DDP:
    torch.manual_seed(0)
    return DDP(MLP())


def _batch(rank: int) -> tuple:
    g = torch.Generator().manual_seed(rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def _step(options: dict, rank: int) -> list:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = trainc.compile_step(model, loss_fn, opt, cache_artifacts=False, **options)
    with records.recording() as recs:
        step(*_batch(rank))
    return list(recs)


def _same(rank: int) -> None:
    before = decisions.checks
    # a SavePolicy's frozensets iterate in per-process hash order: its text must not
    from trainc.partition.policy import SavePolicy
    recs = _step({"backend": "aten", "memory_budget": 0.0, "policy": SavePolicy()}, rank)
    model = _model()
    compiled = trainc.compile(model, backend="aten", cache_artifacts=False)
    with records.recording() as more:
        loss_fn(compiled, *_batch(rank)).backward()
    recs += list(more)
    assert len(recs) >= 2, recs
    for r in recs:
        assert r.rank_check == "same on 2 ranks", (r.graph_id, r.rank_check)
        assert len(r.decision_hash) == 64 and "partition." in str(r.decision_record)
        digests = [None] * WORLD
        dist.all_gather_object(digests, r.decision_hash)
        assert digests[0] == digests[1]
    assert decisions.checks - before == len(recs)
    assert "decisions: sha256" in trainc.Explanation(tuple(recs)).table()


def _planted(rank: int) -> None:
    """Rank 1 asks for the lowest-peak partition: both ranks raise, naming a partition choice."""
    budget = {"memory_budget": 0.0} if rank == 1 else {}
    for run in (lambda: _step({"backend": "aten", **budget}, rank),
                lambda: loss_fn(trainc.compile(_model(), backend="aten", cache_artifacts=False,
                                               **budget), *_batch(rank)).backward()):
        with pytest.raises(trainc.RankMismatchError) as info:
            run()
        text = str(info.value)
        assert "first differing decision 'config.memory_budget'" in text, text
        assert "rank 0: None" in text and "rank 1: 0.0" in text, text
    ok = torch.ones(1)
    dist.all_reduce(ok)  # no rank is left waiting in the check: the group still works
    assert ok.item() == WORLD
    # off: the ranks go on with their own partitions (their gradients still averaged)
    recs = _step({"backend": "aten", "check_rank_decisions": False, **budget}, rank)
    assert recs and all(r.rank_check == "" for r in recs)


def _missing(rank: int) -> None:
    """Only rank 0 compiles a graph: it names rank 1 once the store's timeout passes. Last job:
    the ranks' check rounds no longer line up after it."""
    model = _model()  # DDP's constructor is a collective: on both ranks
    step = trainc.compile_step(model, loss_fn, torch.optim.SGD(model.parameters(), lr=0.1),
                               backend="aten", cache_artifacts=False)
    store = dist.distributed_c10d._get_process_group_store(dist.group.WORLD)
    store.set_timeout(datetime.timedelta(seconds=3))
    if rank == 0:
        with pytest.raises(trainc.RankMismatchError, match=r"rank\(s\) \[1\] did not compile"):
            step(*_batch(rank))
    dist.barrier()


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[str, str]:
    """One set of processes runs every job (gloo_jobs.py)."""
    return gloo_jobs.run("test_rank_decisions", list(JOBS), tmp_path_factory.mktemp("rank_decisions"), WORLD,
                         TIMEOUT)


def _outcome(ran: tuple[str, str], job: str) -> None:
    gloo_jobs.outcome(ran, job, WORLD)


def test_same_decisions_are_checked(ran):
    _outcome(ran, "same")


def test_planted_difference_raises_on_every_rank(ran):
    _outcome(ran, "planted")


def test_missing_rank_is_named_not_hung(ran):
    _outcome(ran, "missing")


def test_record_names_a_partition_choice():
    """One process: the records of two budgets, config lines dropped, differ first in a
    partition choice, and the message names it with each rank's value."""
    x = torch.randn(6, 8)
    recs = [trainc.explain(MLP(), x, backend="aten", cache_artifacts=False,
                           memory_budget=b).graphs[0].decision_record for b in (None, 0.0)]
    assert recs[0].digest == trainc.explain(MLP(), x, backend="aten", cache_artifacts=False) \
        .graphs[0].decision_record.digest  # stable: nothing address- or time-dependent
    items = [tuple(i for i in r.items if not i[0].startswith("config.")) for r in recs]
    text = decisions.mismatch_message(["graph_0 (train)"] * 2, items)
    first = text.split("first differing decision '")[1].split("'")[0]
    assert first.startswith("partition."), text
    assert f"rank 0: {dict(items[0])[first]}" in text, text
    assert f"rank 1: {dict(items[1])[first]}" in text, text


def test_cache_hit_has_the_hash_of_the_compile(tmp_path):
    """Ranks sharing a cache dir: one compiles and stores, the other hits; same decisions."""
    x, gs = torch.randn(6, 8), []
    for _ in range(2):
        gs.append(trainc.explain(MLP(), x, backend="cpp", cache_dir=str(tmp_path),
                                 cache_artifacts=True).graphs[0])
    assert gs[0].cache.startswith("miss") and gs[1].cache == "hit", [g.cache for g in gs]
    assert gs[0].decision_hash == gs[1].decision_hash != ""


def test_policy_text_does_not_follow_hash_order():
    """A SavePolicy's frozensets print sorted: set order follows per-process string hashes."""
    from trainc.partition.policy import SavePolicy
    a = SavePolicy(never=frozenset({"aten.gelu", "aten.tanh", "aten.exp", "aten.sin"}))
    b = SavePolicy(never=frozenset(sorted(a.never, reverse=True)))
    assert decisions.canonical(a) == decisions.canonical(b)
    assert "never={'aten.exp', 'aten.gelu', 'aten.sin', 'aten.tanh'}" in decisions.canonical(a)


JOBS = {"same": _same, "planted": _planted, "missing": _missing}
