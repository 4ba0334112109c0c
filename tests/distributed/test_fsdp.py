"""FSDP2 (`fully_shard`) and DDP of CNNs with trainc.compile: 2 gloo processes on CPU, 5 SGD
steps against eager FSDP2 / DDP, the float64 eager run as the policy's reference.

Each layer is sharded on its own (per-layer `fully_shard`, then the root). FSDP2's hooks (the
all-gather before a layer's forward, the reduce-scatter after its backward) run eagerly around
each layer's compiled graph, as under torch.compile: Dynamo breaks the graph at every sharded
module's call. The tests pin that structure too, so a change to it is seen.
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

WORLD, STEPS, TIMEOUT = 2, 5, 300
pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="needs torch.distributed with gloo")


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for y in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Layer(nn.Module):
    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 11, d: int = 16, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x))


class ConvBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.bn(self.conv(x)))


class CNN(nn.Module):
    def __init__(self, c: int = 8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.layers = nn.ModuleList(ConvBlock(c) for _ in range(2))
        self.head = nn.Linear(c, 4)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean((2, 3)))


def _batches(rank: int, name: str, dtype=torch.float32) -> list:
    g = torch.Generator().manual_seed(2000 + rank)  # different data on every rank
    if name == "transformer":
        return [(torch.randint(0, 11, (3, 8), generator=g),
                 torch.randint(0, 11, (3, 8), generator=g)) for _ in range(STEPS)]
    return [(torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64).to(dtype),
             torch.randint(0, 4, (4,), generator=g)) for _ in range(STEPS)]


def _loss(out, y):
    return F.cross_entropy(out.float().flatten(0, -2), y.flatten())


def _base(name: str) -> nn.Module:
    torch.manual_seed(0)
    return {"transformer": Transformer, "cnn": CNN}[name]()


def _shard(model: nn.Module, mp_policy=None) -> nn.Module:
    from torch.distributed.fsdp import fully_shard
    kw = {"mp_policy": mp_policy} if mp_policy is not None else {}
    for layer in model.layers:
        fully_shard(layer, **kw)
    return fully_shard(model, **kw)


def _train(model: nn.Module, call, batches) -> dict:
    """Eager-style loop (call may be compiled): the full parameters and buffers after it."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        _loss(call(x), y).backward()
        opt.step()
        opt.zero_grad()
    state = {}
    for k, v in model.state_dict().items():
        state[k] = (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
    return state


def _check(label: str, got: dict, eager: dict, ref: dict) -> None:
    for k in ref:
        if got[k].is_floating_point():
            assert_policy(f"{label} {k}", got[k], eager[k], ref[k])
        else:
            assert torch.equal(got[k], eager[k]), f"{label} {k}"


def _fsdp(rank: int, name: str, mixed: bool = False) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if mixed else None
    base = _base(name)
    ref_base = copy.deepcopy(base).double()
    ref_batches = [(x.double() if x.is_floating_point() else x, y)
                   for x, y in _batches(rank, name)]
    ref_model = _shard(ref_base)
    ref = _train(ref_model, ref_model, ref_batches)
    eager_model = _shard(copy.deepcopy(base), mp)
    eager = _train(eager_model, eager_model, _batches(rank, name))
    torch._dynamo.reset()
    model = _shard(copy.deepcopy(base), mp)
    compiled = trainc.compile(model)
    with records.recording() as recs:
        got = _train(model, compiled, _batches(rank, name))
    # one graph for the sharded layers' class (both layers run it), nothing else compiled:
    # Dynamo skips the root's frame (its loop calls sharded modules, each a graph break)
    assert len(recs) == 1 and recs[0].training, [str(r)[:200] for r in recs]
    _check(f"{name} fsdp{' mixed' if mixed else ''}", got, eager, ref)


def _ddp_cnn(rank: int) -> None:
    base = _base("cnn")
    runs = []
    for dtype, compiled in ((torch.float64, False), (torch.float32, False),
                            (torch.float32, True)):
        model = DDP(copy.deepcopy(base).to(dtype))
        call = trainc.compile(model) if compiled else model
        batches = [(x.to(dtype), y) for x, y in _batches(rank, "cnn")]
        with records.recording() as recs:
            state = _train(model, call, batches)
        if compiled:
            assert recs, "nothing was compiled"
        runs.append({k.removeprefix("module."): v for k, v in state.items()})
    ref, eager, got = runs
    _check("cnn ddp", got, eager, ref)


def _untimed(rank: int) -> None:
    """Timed kernel choices (cpp_gemm="auto") could differ between ranks: resolved to ATen's."""
    from trainc.codegen import target_for
    from trainc.config import make_config, resolve
    config = resolve(make_config("cpp"), target_for("cpp", torch.device("cpu")), "cpu")
    assert config.cpp_gemm == "aten", config.cpp_gemm


JOBS = {"untimed": _untimed, "fsdp_transformer": lambda rank: _fsdp(rank, "transformer"),
        "fsdp_cnn": lambda rank: _fsdp(rank, "cnn"),
        "fsdp_mixed": lambda rank: _fsdp(rank, "transformer", mixed=True),
        "ddp_cnn": _ddp_cnn}


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[str, str]:
    return gloo_jobs.run("test_fsdp", list(JOBS), tmp_path_factory.mktemp("fsdp"), WORLD,
                         TIMEOUT)


@pytest.mark.parametrize("job", list(JOBS))
def test_matches_eager(ran, job):
    gloo_jobs.outcome(ran, job, WORLD)
