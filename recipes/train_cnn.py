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

import common
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


def train(model, args, label: str, compiled: bool):
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = common.make_step(model, opt, loss_fn, args, compiled)
    data = batches(args.steps, args.batch, args.hw, 10, args.device)
    return common.train(step, data, args.device, label)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_args(ap, steps=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hw", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    common.check_args(ap, args)

    torch.manual_seed(0)
    eager_model = ConvNet().to(args.device)
    trainc_model = copy.deepcopy(eager_model)
    print(f"ConvNet on synthetic {args.hw}x{args.hw} images, batch {args.batch}, "
          f"{args.steps} steps on {args.device}, trainc mode {args.mode!r}")
    eager = train(eager_model, args, "eager", compiled=False)
    compiled = train(trainc_model, args, "trainc", compiled=True)
    common.compare(eager, compiled, args.batch, "images")
    print(f"BatchNorm running mean (first layer, first 3): eager "
          f"{eager_model.features[1].running_mean[:3].tolist()} trainc "
          f"{trainc_model.features[1].running_mean[:3].tolist()}")


if __name__ == "__main__":
    main()
