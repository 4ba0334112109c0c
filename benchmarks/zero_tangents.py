"""Backward ms of a small LM returning (loss, logits), only the loss differentiated, with the
zero-tangent backward variant (runtime.ZERO_TANGENT) and without it (dense zeros through the
traced backward). Usage: python benchmarks/zero_tangents.py [--backend cpp] [--chunk-loss]"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import trainc
from trainc import chunked_loss, pipeline, runtime


class LM(nn.Module):
    def __init__(self, vocab, width, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width),
                                                  nn.GELU(), nn.Linear(4 * width, width))
                                    for _ in range(layers))
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids, tgt):
        h = self.emb(ids)
        for b in self.blocks:
            h = h + b(h)
        logits = self.head(h)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1)), logits


def measure(args, variant: bool) -> list:
    torch._dynamo.reset()
    torch.manual_seed(0)
    runtime.ZERO_TANGENT_EXPAND_BYTES = (1 << 24) if variant else (1 << 62)
    m = LM(args.vocab, args.width, args.layers)
    c = trainc.compile(m, backend=args.backend, chunk_loss=args.chunk_loss,
                       cache_artifacts=False)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    times = []
    for i in range(args.warmup + args.iters):
        loss, _ = c(ids, ids)
        t0 = time.perf_counter()
        loss.backward()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        m.zero_grad(set_to_none=True)
    return times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="cpp")
    p.add_argument("--chunk-loss", action="store_true")
    p.add_argument("--chunk-mib", type=int, default=8, help="chunked_loss.CHUNK_BYTES")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    args = p.parse_args()
    chunked_loss.CHUNK_BYTES = args.chunk_mib << 20
    made, real = [], pipeline._zero_tangent_backward
    pipeline._zero_tangent_backward = lambda *a: made.append(1) or real(*a)
    print(f"{args}\n| backward | median ms | min ms |\n|---|---|---|")
    for variant in (False, True):
        t = measure(args, variant)
        print(f"| {'zero-tangent variant' if variant else 'dense zeros, traced'} | "
              f"{statistics.median(t):.1f} | {min(t):.1f} |")
    print(f"zero-tangent variants compiled: {len(made)}")


if __name__ == "__main__":
    main()
