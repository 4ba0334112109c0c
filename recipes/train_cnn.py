"""Train a Conv-BatchNorm-ReLU network on synthetic images, eagerly and with trainc, side by side.

    python recipes/train_cnn.py [--steps 30] [--device cpu] [--budget None] [--backend auto]
                                [--mode step|model]

Each class is a fixed random template; a sample is its class template, shifted and noised, so
the loss falls within a few dozen SGD steps. `--mode step` compiles the whole step (forward,
loss, backward, SGD with momentum) with trainc.compile_step; `--mode model` compiles the model.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import trainc


class ConvNet(nn.Module):
    def __init__(self, width: int = 16, blocks: int = 4, classes: int = 10):
        super().__init__()
        layers, c = [], 3
        for i in range(blocks):
            layers += [nn.Conv2d(c, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                       nn.ReLU()]
            if i % 2 == 1:
                layers.append(nn.MaxPool2d(2))
            c = width
        self.features, self.fc = nn.Sequential(*layers), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean(dim=(2, 3)))


def batches(steps: int, batch: int, hw: int, classes: int, device: str):
    g = torch.Generator().manual_seed(0)
    templates = torch.randn(classes, 3, hw, hw, generator=g)
    for _ in range(steps):
        y = torch.randint(0, classes, (batch,), generator=g)
        shift = int(torch.randint(-2, 3, (), generator=g))
        x = templates[y].roll(shift, dims=3) + 0.5 * torch.randn(batch, 3, hw, hw, generator=g)
        yield x.to(device), y.to(device)


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def make_step(model, opt, args, compiled: bool):
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


def train(model, args, label: str, compiled: bool):
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = make_step(model, opt, args, compiled)
    losses, times = [], []
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for x, y in batches(args.steps, args.batch, args.hw, 10, args.device):
        t0 = time.perf_counter()
        loss = step(x, y)
        if args.device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None
    print(f"  {label}: final loss {losses[-1]:.3f}"
          + (f", peak {peak:.0f} MiB" if peak is not None else ""))
    return losses, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--budget", type=float, default=None, help="trainc memory_budget fraction")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--mode", choices=("step", "model"), default="step")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hw", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    if args.budget is not None and args.mode == "step":
        ap.error("--budget applies to --mode model (compile_step has no autograd boundary yet)")

    torch.manual_seed(0)
    eager_model = ConvNet().to(args.device)
    trainc_model = copy.deepcopy(eager_model)
    print(f"ConvNet on synthetic {args.hw}x{args.hw} images, batch {args.batch}, "
          f"{args.steps} steps on {args.device}, trainc mode {args.mode!r}")
    eager_losses, eager_t = train(eager_model, args, "eager", compiled=False)
    trainc_losses, trainc_t = train(trainc_model, args, "trainc", compiled=True)
    print(f"\n{'step':>4}  {'eager loss':>10}  {'trainc loss':>11}  {'eager ms':>8}  {'trainc ms':>9}")
    for i, (le, lt, te, tt) in enumerate(zip(eager_losses, trainc_losses, eager_t, trainc_t)):
        print(f"{i:>4}  {le:>10.4f}  {lt:>11.4f}  {te * 1e3:>8.1f}  {tt * 1e3:>9.1f}")
    skip = min(3, args.steps - 1)
    med_e, med_t = statistics.median(eager_t[skip:]), statistics.median(trainc_t[skip:])
    print(f"\nmedian step after warm-up: eager {med_e * 1e3:.1f} ms, trainc {med_t * 1e3:.1f} ms "
          f"({med_e / med_t:.2f}x); throughput trainc {args.batch / med_t:.0f} images/s")
    print(f"BatchNorm running mean (first layer, first 3): eager "
          f"{eager_model.features[1].running_mean[:3].tolist()} trainc "
          f"{trainc_model.features[1].running_mean[:3].tolist()}")


if __name__ == "__main__":
    main()
