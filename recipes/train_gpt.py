"""Train a character-level GPT on Shakespeare's sonnets with eager PyTorch, torch.compile and
trainc, side by side, then show trainc's memory/recompute trade-off (table and PNG plot).

    python recipes/train_gpt.py [--steps 40] [--device cpu] [--mode step|model] [--budget F]
                                [--out train_gpt_out] [--d 128 --layers 2 --batch 32 --seq 256]
    torchrun --nproc-per-node N recipes/train_gpt.py --ddp | --fsdp [...]

With --ddp every run wraps its model in DistributedDataParallel; with --fsdp each block and then
the model are sharded with FSDP2's fully_shard (trainc compiles the model then: compile_step
refuses FSDP). Each rank trains on its own batches (gloo on CPU, NCCL on CUDA); rank 0 prints.

The three runs start from the same weights, see the same batches and take their steps in turn
(a busy machine slows them alike). torch.compile compiles the model (loss and AdamW eager);
trainc, with `--mode step` (default), compiles the whole step (forward, loss, backward, AdamW)
with trainc.compile_step, and with `--mode model` the model only, as torch.compile does.
The default size is one where trainc is faster and smaller than both on a 2-core CPU
(BENCHMARKS.md, session 23). Writes <out>/char_gpt_tradeoff.{csv,json,png}.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import math
import os

import common
import torch
import torch.nn as nn
import torch.nn.functional as F

import trainc
import trainc.report

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


def batches(data: torch.Tensor, steps: int, batch: int, seq: int, device: str, rank: int = 0):
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s:s + seq] for s in starts])
        y = torch.stack([data[s + 1:s + seq + 1] for s in starts])
        yield x.to(device), y.to(device)


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))


def make_steps(model: nn.Module, args) -> tuple[dict, list]:
    """eager, torch.compile and trainc steps, each with its own copy of `model` and AdamW."""
    steps, scheds = {}, []
    for label in ("eager", "torch.compile", "trainc"):
        m = parallel(copy.deepcopy(model), args)
        opt = torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.01)
        scheds.append(torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps))
        if label == "torch.compile":
            steps[label] = eager_step(torch.compile(m), opt)
        else:
            steps[label] = common.make_step(m, opt, loss_fn, args, compiled=label == "trainc")
    return steps, scheds


def parallel(model: nn.Module, args) -> nn.Module:
    """The model as --ddp or --fsdp wraps it (unchanged without either)."""
    if args.ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard
        for b in model.blocks:
            fully_shard(b)
        return fully_shard(model)
    return model


def init_distributed(args) -> int:
    """torchrun's process group (gloo on CPU, NCCL on CUDA); this rank."""
    import torch.distributed as dist
    if "RANK" not in os.environ:
        raise SystemExit("--ddp/--fsdp: run under torchrun (torchrun --nproc-per-node N "
                         "recipes/train_gpt.py --ddp)")
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    return dist.get_rank()


def eager_step(forward, opt):
    def step(x, y):
        loss = loss_fn(forward, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def tradeoff(model: nn.Module, data: torch.Tensor, args) -> None:
    """trainc's memory/recompute report of the model's forward + backward, one compile per
    memory budget: saved MiB, recompute FLOPs, measured peak and step time."""
    x, y = next(batches(data, 1, args.batch, args.seq, args.device))
    loss = lambda logits, inputs: F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
    print("trainc memory/recompute trade-off (model forward + backward, one compile per "
          "memory budget):", flush=True)
    result = trainc.report.tradeoff(model, (x,), loss, (None, 0.5, 0.0), name="char_gpt",
                                    steps=5, out_dir=args.out, progress=False,
                                    backend=args.backend)
    print(result.table())
    print(f"plot: {os.path.join(args.out, 'char_gpt_tradeoff.png')} (peak memory vs step time "
          f"per budget; the Pareto frontier marked)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_args(ap, steps=40)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--out", default="train_gpt_out")
    ap.add_argument("--ddp", action="store_true", help="DistributedDataParallel (torchrun)")
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard per block (torchrun)")
    args = ap.parse_args()
    common.check_args(ap, args)
    if args.ddp and args.fsdp:
        ap.error("--ddp and --fsdp: choose one")
    rank = init_distributed(args) if args.ddp or args.fsdp else 0
    if args.fsdp and args.mode == "step":
        args.mode = "model"  # compile_step refuses FSDP-sharded models
    with contextlib.redirect_stdout(io.StringIO()) if rank else contextlib.nullcontext():
        run(args, rank)
    if args.ddp or args.fsdp:
        import torch.distributed as dist
        dist.destroy_process_group()


def run(args, rank: int) -> None:
    text = open(TEXT).read()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    torch.manual_seed(0)
    model = CharGPT(len(chars), d=args.d, layers=args.layers, seq=args.seq,
                    dropout=args.dropout).to(args.device)
    wrap = " under DDP" if args.ddp else " sharded with FSDP2" if args.fsdp else ""
    print(f"char-GPT: {sum(p.numel() for p in model.parameters()) / 1e3:.0f}k params, "
          f"{args.layers} layers of width {args.d}, batch {args.batch} x {args.seq} characters"
          f"{wrap}; {args.steps} steps on {args.device} ({torch.get_num_threads()} threads); "
          f"trainc mode {args.mode!r}. The first steps compile.", flush=True)
    steps, scheds = make_steps(model, args)
    runs = common.train_together(steps, batches(data, args.steps, args.batch, args.seq,
                                                args.device, rank), args.device,
                                 after_step=lambda label: scheds[list(steps).index(label)].step())
    common.compare_all(runs, args.batch * args.seq, "tok")
    if not (args.ddp or args.fsdp):
        tradeoff(model, data, args)


if __name__ == "__main__":
    main()
