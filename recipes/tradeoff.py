"""Memory / recompute trade-off of a char-GPT training step: one compile per memory budget.

    python recipes/tradeoff.py [--device cpu] [--steps 5] [--budget 0.5] [--out tradeoff_out]

For each budget (default: None, 1.0, 0.75, 0.5, 0.25, 0.1, 0.0; `--budget b` adds one more):
saved bytes, recompute FLOPs, simulated and measured peak memory and step time. Writes
<out>/char_gpt_tradeoff.{csv,json,png}; the plot marks the Pareto frontier.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

import trainc
import trainc.report

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_gpt import TEXT, CharGPT  # noqa: E402

BUDGETS = (None, 1.0, 0.75, 0.5, 0.25, 0.1, 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per budget")
    ap.add_argument("--budget", type=float, default=None, help="an extra budget to measure")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--out", default="tradeoff_out")
    args = ap.parse_args()

    text = open(TEXT).read()
    chars = sorted(set(text))
    torch.manual_seed(0)
    model = CharGPT(len(chars), seq=args.seq).to(args.device)
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    starts = torch.randint(0, len(data) - args.seq - 1, (args.batch,))
    x = torch.stack([data[s:s + args.seq] for s in starts]).to(args.device)
    y = torch.stack([data[s + 1:s + args.seq + 1] for s in starts]).to(args.device)

    def loss_fn(logits, inputs):
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    budgets = BUDGETS + ((args.budget,) if args.budget is not None else ())
    result = trainc.report.tradeoff(model, (x,), loss_fn, budgets, name="char_gpt",
                                    steps=args.steps, out_dir=args.out, backend=args.backend)
    print(result)


if __name__ == "__main__":
    main()
