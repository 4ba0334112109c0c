"""A tiny random-program generator for the pass tests, and helpers to run joint/fwd/bwd graphs.

A program is a straight-line function of float tensors x0..x{n-1} (4x6, requiring grad), an index
vector and a non-grad buffer `buf` (6,). Ops keep the 4x6 shape so any value can feed any op;
they include the patterns the passes target: noops (x*1, clone, view chains), scalar arithmetic,
duplicate subexpressions, random ops, indexing/slicing (index_put/slice_scatter in the backward),
values used many times (gradient accumulation) and an in-place update of `buf`.
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
import torch.nn.functional as F

from trainc.graph import InputKind

SHAPE = (4, 6)

UNARY: dict[str, Callable] = {
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "neg": torch.neg,
    "exp": lambda a: torch.exp(a.clamp(-3, 3)),
    "mul1": lambda a: a * 1, "add0i": lambda a: a + 0, "sub0": lambda a: a - 0,
    "div1": lambda a: a / 1, "clone": lambda a: a.clone(), "to": lambda a: a.to(torch.float32),
    "tt": lambda a: a.t().t(), "views": lambda a: a.reshape(24).view(2, 12).view(4, 6),
    "perm": lambda a: a.unsqueeze(0).permute(1, 0, 2).permute(1, 0, 2).squeeze(0),
    "negneg": lambda a: -(-a), "mulm1": lambda a: a * -1,
    "scalar": lambda a: a * (a.new_ones(()) * 2 + 1),
    "dup": lambda a: torch.sin(a) + torch.sin(a),
    "dropout2": lambda a: F.dropout(a, 0.5, True) + F.dropout(a, 0.5, True),
    "slice": lambda a: torch.cat([a[:, 1:4], a[:, :3] * 2], dim=1),
    "select": lambda a: a * a[:, 2].unsqueeze(1),
    "rowsum": lambda a: a - a.sum(1, keepdim=True) / 6,
    "setcol": lambda a: _set_column(a),
}
# Not drawn at random: partition/cost.py does not take tensor constants yet (KeyError).
EXTRA: dict[str, Callable] = {
    "const": lambda a: a * a.new_tensor([0.5, 0.7, 0.9, 1.1, 1.3, 1.5]),  # a traced constant
}
BINARY: dict[str, Callable] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 1), "mm": lambda a, b: (a @ b.t()) @ b / 8,
    "where": lambda a, b: torch.where(a > b, a, b * 0.5),
}
RANDOM_OPS = ("dropout2",)


def _set_column(a):
    b = a * 2
    b.select(1, 2).copy_(a[:, 0])  # a select_scatter, which the decompositions turn into where
    return b


@dataclass
class Program:
    steps: list  # (name, operand indices)
    outputs: list[int]
    gather: bool  # use x0[idx] (embedding-style gather -> index_put in the backward)
    mutate: bool  # update `buf` in place (write-back of a mutated input)

    @property
    def random(self) -> bool:
        return any(name in RANDOM_OPS for name, _ in self.steps)

    def __call__(self, *args):
        *xs, idx, buf = args
        pool = list(xs)
        if self.gather:
            pool.append(xs[0][idx].repeat(2, 1)[:4] + xs[-1])
        for name, operands in self.steps:
            fn = UNARY.get(name) or EXTRA.get(name) or BINARY[name]
            pool.append(fn(*[pool[i % len(pool)] for i in operands]))
        if self.mutate:
            buf.mul_(0.9).add_(pool[-1].detach().mean(0) * 0.1)
        outs = [pool[i % len(pool)] for i in self.outputs]
        return tuple(o.sum(0) if k % 2 else o for k, o in enumerate(outs))


def random_program(seed: int, n_inputs: int = 3, n_steps: int = 10) -> Program:
    rnd = random.Random(seed)
    steps = []
    for k in range(n_steps):
        live = n_inputs + 1 + k
        if rnd.random() < 0.6:
            steps.append((rnd.choice(sorted(UNARY)), (rnd.randrange(live),)))
        else:
            steps.append((rnd.choice(sorted(BINARY)), (rnd.randrange(live), rnd.randrange(live))))
    outputs = [-1, rnd.randrange(n_inputs + n_steps)]
    return Program(steps, outputs, gather=rnd.random() < 0.7, mutate=rnd.random() < 0.5)


def program_inputs(seed: int, n_inputs: int = 3, dtype=torch.float32) -> list:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(SHAPE, generator=g, dtype=dtype).requires_grad_(True)
          for _ in range(n_inputs)]
    idx = torch.randint(0, SHAPE[0], (2,), generator=g)
    buf = torch.randn(SHAPE[1], generator=g, dtype=dtype)
    return [*xs, idx, buf]


def input_kinds(n_inputs: int = 3) -> list[InputKind]:
    return [InputKind.USER] * n_inputs + [InputKind.USER, InputKind.BUFFER]


def traced(program: Program) -> fx.GraphModule:
    """The program as an FX graph, the form the Dynamo front end hands to the pipeline."""
    return fx.symbolic_trace(_Wrap(program))


class _Wrap(torch.nn.Module):
    def __init__(self, program: Program):
        super().__init__()
        self.program = program

    def forward(self, x0, x1, x2, idx, buf):
        return self.program(x0, x1, x2, idx, buf)


def clone_inputs(args: list) -> list:
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
            else a for a in args]


def copy_gm(gm: fx.GraphModule) -> fx.GraphModule:
    """A deep copy whose node metas (FakeTensors) are shared, not copied."""
    graph = fx.Graph()
    env: dict = {}
    for n in gm.graph.nodes:
        env[n] = graph.node_copy(n, lambda a: env[a])
        env[n].meta = dict(n.meta)
    new = fx.GraphModule(gm, graph)
    new.meta = copy.copy(gm.meta)
    return new


def run_graph(gm: fx.GraphModule, inputs: list) -> list:
    """Run a graph on fresh copies of `inputs` (so in-place ops cannot touch the originals);
    returns its outputs and the inputs after the run."""
    ins = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in inputs]
    # ATen's CPU index_put(accumulate=True) sums duplicates in a thread-dependent order.
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with torch.no_grad():
            outs = list(gm(*ins))
    finally:
        torch.use_deterministic_algorithms(was)
    return [o.clone() if isinstance(o, torch.Tensor) else o for o in outs] + ins


def real_inputs(gm: fx.GraphModule, seed: int = 0) -> list:
    """Random real tensors shaped like a graph's placeholders (ints in range for indexing)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta["val"]
        if n.name == "seed":
            out.append(torch.tensor(1234, dtype=torch.int64))
        elif v.dtype.is_floating_point:
            out.append(_strided(torch.randn(v.shape, generator=g, dtype=v.dtype), v))
        elif v.dtype == torch.bool:
            out.append(_strided(torch.rand(v.shape, generator=g) < 0.5, v))
        else:
            out.append(_strided(torch.randint(0, 2, v.shape, generator=g, dtype=v.dtype), v))
    return out


def _strided(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(like.shape, like.stride(), dtype=x.dtype).copy_(x)


def bitwise_equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        (x is None and y is None) or (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                                     and x.shape == y.shape and x.dtype == y.dtype
                                     and x.stride() == y.stride() and torch.equal(x, y))
        or (not isinstance(x, torch.Tensor) and x == y) for x, y in zip(a, b))
