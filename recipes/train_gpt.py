"""Train a small character-level GPT on Shakespeare's sonnets, eagerly and with trainc, side by side.

    python recipes/train_gpt.py [--steps 40] [--device cpu] [--budget None] [--backend auto]
                                [--mode step|model]

`--mode step` (default) compiles the whole training step (forward, loss, backward, AdamW) with
trainc.compile_step; `--mode model` compiles the model with trainc.compile and keeps loss and
optimizer eager (needed for --budget). Both runs start from the same weights and see the same
batches; the script prints per-step loss and time, then the comparison and trainc's
memory/recompute report.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import time

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


def make_step(model: nn.Module, opt, args, compiled: bool):
    """One training step as a function of the batch: eager, or compiled by trainc."""
    options = dict(backend=args.backend, memory_budget=args.budget)
    if compiled and args.mode == "step":
        return trainc.compile_step(model, loss_fn, opt, **options)
    forward = trainc.compile(model, **options) if compiled else model

    def step(x, y):
        loss = loss_fn(forward, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def train(model, data, args, label, compiled):
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    step = make_step(model, opt, args, compiled)
    losses, times = [], []
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for x, y in batches(data, args.steps, args.batch, args.seq, args.device):
        t0 = time.perf_counter()
        loss = step(x, y)
        sched.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None
    print(f"  {label}: done, final loss {losses[-1]:.3f}"
          + (f", peak {peak:.0f} MiB" if peak is not None else ""))
    return losses, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--budget", type=float, default=None, help="trainc memory_budget fraction")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--mode", choices=("step", "model"), default="step")
    args = ap.parse_args()
    if args.budget is not None and args.mode == "step":
        ap.error("--budget applies to --mode model (compile_step has no autograd boundary yet)")

    text = open(TEXT).read()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    torch.manual_seed(0)
    eager_model = CharGPT(len(chars), seq=args.seq, dropout=args.dropout).to(args.device)
    trainc_model = copy.deepcopy(eager_model)
    print(f"char-GPT: {sum(p.numel() for p in eager_model.parameters()) / 1e3:.0f}k params, "
          f"vocab {len(chars)}, {len(text)} chars of text; {args.steps} steps on {args.device}, "
          f"trainc mode {args.mode!r}")
    eager_losses, eager_t = train(eager_model, data, args, "eager", compiled=False)
    trainc_losses, trainc_t = train(trainc_model, data, args, "trainc", compiled=True)

    print(f"\n{'step':>4}  {'eager loss':>10}  {'trainc loss':>11}  {'eager ms':>8}  {'trainc ms':>9}")
    for i, (le, lt, te, tt) in enumerate(zip(eager_losses, trainc_losses, eager_t, trainc_t)):
        print(f"{i:>4}  {le:>10.4f}  {lt:>11.4f}  {te * 1e3:>8.1f}  {tt * 1e3:>9.1f}")
    skip = min(3, args.steps - 1)  # the first steps include trainc's compile
    med_e, med_t = statistics.median(eager_t[skip:]), statistics.median(trainc_t[skip:])
    print(f"\nmedian step after warm-up: eager {med_e * 1e3:.1f} ms, trainc {med_t * 1e3:.1f} ms "
          f"({med_e / med_t:.2f}x); trainc first step {trainc_t[0]:.2f} s (includes compile)")
    print(f"loss fell from {eager_losses[0]:.3f} to {eager_losses[-1]:.3f} (eager), "
          f"{trainc_losses[0]:.3f} to {trainc_losses[-1]:.3f} (trainc)\n")
    x, _ = next(batches(data, 1, args.batch, args.seq, args.device))
    print("trainc memory/recompute report (model forward+backward, as trainc.compile splits it):")
    print(trainc.explain(trainc_model, x, backend=args.backend, memory_budget=args.budget))


if __name__ == "__main__":
    main()
