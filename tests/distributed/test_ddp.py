"""DistributedDataParallel with trainc: 2 gloo processes on CPU, 5 SGD steps against eager DDP.

Each rank trains on its own data; the float64 eager DDP run is the policy's reference. Workers
run in one pair of spawned processes (a FileStore in a tmp dir); a worker's exception fails its
test with the traceback, and a hang fails the tests after TIMEOUT seconds (collectives time out
after 60 s).
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gloo_jobs
import trainc
from policy import assert_policy
from trainc import records

WORLD, STEPS, TIMEOUT = 2, 5, 240
pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="needs torch.distributed with gloo")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Transformer-ish: Linear, LayerNorm, GELU, Linear, residual."""

    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(8, 24), nn.LayerNorm(24), nn.Linear(24, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(x + self.down(F.gelu(self.norm(self.up(x)))))


class Normed(nn.Module):
    """BatchNorm: eager DDP broadcasts rank 0's running stats before every forward."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.bn(self.fc1(x))))


MODELS = {"mlp": MLP, "block": Block}


def loss_fn(model, x, y):
    return F.mse_loss(model(x), y)


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[str, str]:
    """One set of processes runs every job (gloo_jobs.py)."""
    return gloo_jobs.run("test_ddp", list(JOBS), tmp_path_factory.mktemp("ddp"), WORLD,
                         TIMEOUT)


def _outcome(ran: tuple[str, str], job: str) -> None:
    gloo_jobs.outcome(ran, job, WORLD)


def _batches(rank: int, dtype=torch.float32) -> list:
    g = torch.Generator().manual_seed(1000 + rank)  # different data on every rank
    return [(torch.randn(6, 8, generator=g, dtype=torch.float64).to(dtype),
             torch.randn(6, 4, generator=g, dtype=torch.float64).to(dtype))
            for _ in range(STEPS)]


def _base(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]()


def _eager_train(model: DDP, call, batches) -> tuple[list, list]:
    """Eager-style loop (call may be a compiled model): params and the last step's grads.
    Grads are zeroed, not dropped: trainc's backward then adds into .grad itself."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for b in batches:
        loss_fn(call, *b).backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=False)
    return [p.detach().clone() for p in model.parameters()], grads


def _step_train(model: DDP, batches, **options) -> tuple[list, list]:
    """compile_step; the last batch runs as accumulate=True first to read its grads."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = trainc.compile_step(model, loss_fn, opt, **options)
    with records.recording() as recs:
        for b in batches[:-1]:
            step(*b)
    assert any("_c10d_functional.all_reduce.default" in r.fallback_ops for r in recs), \
        [r.fallback_ops for r in recs]
    step(*batches[-1], accumulate=True)
    grads = [p.grad.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    step(*batches[-1])
    return [p.detach().clone() for p in model.parameters()], grads


def _same_on_all_ranks(name: str, tensors: list) -> None:
    for i, t in enumerate(tensors):
        first = t.clone()
        dist.broadcast(first, src=0)
        assert torch.equal(first, t), f"{name}: tensor {i} differs between ranks"


def _check(name: str, got: tuple, eager: tuple, ref: tuple) -> None:
    for what, k in (("param", 0), ("grad", 1)):
        for i, (c, e, r) in enumerate(zip(got[k], eager[k], ref[k])):
            assert_policy(f"{name} {what} {i}", c, e, r)
    _same_on_all_ranks(name, got[0])


def _train(rank: int, name: str) -> None:
    base = _base(name)
    ref_model = DDP(copy.deepcopy(base).double())
    ref = _eager_train(ref_model, ref_model, _batches(rank, torch.float64))
    eager_model = DDP(copy.deepcopy(base))
    eager = _eager_train(eager_model, eager_model, _batches(rank))
    # cpp: the backward that adds into .grad (under DDP's reducer hooks); aten is quicker
    for label, wrap in (("trainc.compile", lambda m: trainc.compile(m, accumulate_grads=True)),
                        ("torch.compile", lambda m: torch.compile(
                            m, backend="trainc", options={"backend": "aten"}))):
        model = DDP(copy.deepcopy(base))
        compiled = wrap(model)
        with records.recording() as recs:
            got = _eager_train(model, compiled, _batches(rank))
        assert recs, f"{label}: nothing was compiled"
        _check(f"{name} {label}", got, eager, ref)
    for options in ({}, {"backend": "aten", "memory_budget": 0.0}):
        got = _step_train(DDP(copy.deepcopy(base)), _batches(rank), **options)
        _check(f"{name} compile_step {options}", got, eager, ref)


def _buffers(rank: int) -> None:
    torch.manual_seed(0)
    base = Normed()
    runs = []
    for dtype, compiled in ((torch.float64, False), (torch.float32, False),
                            (torch.float32, True)):
        model = DDP(copy.deepcopy(base).to(dtype))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = trainc.compile_step(model, loss_fn, opt) if compiled else None
        for b in _batches(rank, dtype):
            if compiled:
                step(*b)
                continue
            loss_fn(model, *b).backward()
            opt.step()
            opt.zero_grad()
        runs.append(model.state_dict())
    ref, eager, got = runs
    for k in ref:
        assert_policy(f"normed {k}", got[k], eager[k], ref[k])


def test_ddp_broadcast_buffers(ran):
    _outcome(ran, "buffers")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_ddp_matches_eager(ran, name):
    _outcome(ran, f"train_{name}")


def _no_sync(rank: int) -> None:
    """Micro-batches under no_sync() add local grads; the synced step averages their sum."""
    base, batches = _base("mlp"), _batches(rank)
    results = []
    for compiled in (False, True):
        model = DDP(copy.deepcopy(base))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = trainc.compile_step(model, loss_fn, opt) if compiled else None
        for i, b in enumerate(batches):
            last = i % 2 == 1
            if compiled:
                if last:
                    step(*b)
                else:
                    with model.no_sync():
                        step(*b, accumulate=True)
                continue
            if last:
                loss_fn(model, *b).backward()
                opt.step()
                opt.zero_grad()
            else:
                with model.no_sync():
                    loss_fn(model, *b).backward()
        results.append([p.detach().clone() for p in model.parameters()])
    for i, (e, c) in enumerate(zip(*results)):
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-6, msg=f"param {i}")
    _same_on_all_ranks("no_sync", results[1])


def test_ddp_no_sync_accumulation(ran):
    _outcome(ran, "no_sync")


def _refused(rank: int) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.fsdp import fully_shard
    opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.1)  # noqa: E731
    unused = DDP(_base("mlp"), find_unused_parameters=True)
    hooked = DDP(_base("mlp"))
    hooked.register_comm_hook(None, default_hooks.allreduce_hook)
    builtin = DDP(_base("mlp"))
    builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    sharded = _base("mlp")
    fully_shard(sharded.fc1)
    fully_shard(sharded)
    nested = nn.Sequential(DDP(_base("mlp")))
    for model, words in ((unused, "find_unused_parameters"), (hooked, "communication hook"),
                         (builtin, "FP16_COMPRESS"), (sharded, "FSDP"), (nested, "nested")):
        with pytest.raises(trainc.UnsupportedError, match=words):
            trainc.compile_step(model, loss_fn, opt(model))


def test_ddp_unsupported_is_refused(ran):
    _outcome(ran, "refused")


# In this order: a failed job stops the workers, so the quick independent ones go first.
JOBS = {"refused": _refused, "no_sync": _no_sync, "buffers": _buffers,
        "train_mlp": lambda rank: _train(rank, "mlp"),
        "train_block": lambda rank: _train(rank, "block")}
