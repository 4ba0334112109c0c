"""Train a character-level GPT on Shakespeare's sonnets, eagerly and with trainc, side by side.

    python recipes/train_gpt.py [--steps 40] [--device cpu] [--budget None] [--backend auto]
                                [--mode step|model]

`--mode step` (default) compiles the whole training step (forward, loss, backward, AdamW) with
trainc.compile_step; `--mode model` compiles the model with trainc.compile and keeps loss and
optimizer eager. `--budget` (both modes) trades recomputation for memory. Both runs start from
the same weights and see the same batches; the script prints per-step loss and time, then the
comparison (time, peak memory) and trainc's memory/recompute report.
"""
from __future__ import annotations

import argparse
import copy
import math
import os

import common
import torch
import torch.nn as nn
import torch.nn.functional as F

import trainc

TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sonnets.txt")


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.heads, self.qkv, self.proj = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = self.drop(att.masked_fill(~causal, float("-inf")).softmax(-1))
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.drop(self.mlp(self.ln2(x)))


class CharGPT(nn.Module):
    def __init__(self, vocab: int, d: int = 96, heads: int = 4, layers: int = 2, seq: int = 64,
                 dropout: float = 0.0):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def batches(data: torch.Tensor, steps: int, batch: int, seq: int, device: str):
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s:s + seq] for s in starts])
        y = torch.stack([data[s + 1:s + seq + 1] for s in starts])
        yield x.to(device), y.to(device)


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))


def train(model, data, args, label: str, compiled: bool):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    step = common.make_step(model, opt, loss_fn, args, compiled)
    data = batches(data, args.steps, args.batch, args.seq, args.device)
    return common.train(step, data, args.device, label, after_step=sched.step)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_args(ap, steps=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dropout", type=float, default=0.0)
    args = ap.parse_args()
    common.check_args(ap, args)

    text = open(TEXT).read()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    torch.manual_seed(0)
    eager_model = CharGPT(len(chars), seq=args.seq, dropout=args.dropout).to(args.device)
    trainc_model = copy.deepcopy(eager_model)
    print(f"char-GPT: {sum(p.numel() for p in eager_model.parameters()) / 1e3:.0f}k params, "
          f"vocab {len(chars)}, {len(text)} chars of text; {args.steps} steps on {args.device}, "
          f"trainc mode {args.mode!r}")
    eager = train(eager_model, data, args, "eager", compiled=False)
    compiled = train(trainc_model, data, args, "trainc", compiled=True)
    common.compare(eager, compiled, args.batch * args.seq, "tokens")
    if args.mode == "step":
        print("trainc report of the compiled training step(s):")
        print(trainc.Explanation(compiled.records))
    else:
        x, _ = next(batches(data, 1, args.batch, args.seq, args.device))
        print("trainc memory/recompute report (model forward+backward):")
        print(trainc.explain(trainc_model, x, backend=args.backend, memory_budget=args.budget))


if __name__ == "__main__":
    main()
