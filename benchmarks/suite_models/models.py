"""The benchmark suite models (mlp, gpt, convnet, normact), copied into the repo from the team's
shared/bench/models.py (session 23) so that a fresh clone tests and benchmarks them.

Shared benchmark suite: the training workloads every comparison uses.

Each entry builds a model, a batch and a loss on a device; `step` runs one
forward+backward. Sizes come in two scales: "cpu" (fits a 2-core CI box)
and "gpu" (fills an H200). Keep this file dependency-free beyond torch.
"""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d, depth):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            for _ in range(depth))

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x


class Attention(nn.Module):
    """Causal self-attention written with explicit matmul+softmax (fusion work)."""

    def __init__(self, d, heads, dropout):
        super().__init__()
        self.h, self.qkv, self.proj, self.p = heads, nn.Linear(d, 3 * d), nn.Linear(d, d), dropout

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(T, T, device=x.device, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        att = F.dropout(att, self.p, self.training)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return F.dropout(self.proj(y), self.p, self.training)


class GPTBlock(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d),
                                 nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, heads, layers, seq, dropout=0.0):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(GPTBlock(d, heads, dropout) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


class ConvNet(nn.Module):
    """Conv-BatchNorm-ReLU stack: exercises buffer mutation (running stats)."""

    def __init__(self, width, blocks, classes=10):
        super().__init__()
        layers, c = [], 3
        for i in range(blocks):
            layers += [nn.Conv2d(c, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
            if i % 2 == 1:
                layers.append(nn.MaxPool2d(2))
            c = width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))


class NormAct(nn.Module):
    """Bandwidth-bound chain: LayerNorm, GELU, residual, softmax. No matmuls."""

    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        y = F.gelu(self.ln(x)) + x
        return torch.softmax(y * 0.5, dim=-1) * y


SIZES = {
    # name: (cpu kwargs, gpu kwargs)
    "mlp": (dict(d=256, depth=4, batch=64), dict(d=2048, depth=8, batch=8192)),
    "gpt": (dict(vocab=512, d=128, heads=4, layers=2, seq=64, batch=4),
            dict(vocab=50304, d=768, heads=12, layers=6, seq=1024, batch=8)),
    "convnet": (dict(width=16, blocks=4, hw=32, batch=8), dict(width=128, blocks=8, hw=64, batch=128)),
    "normact": (dict(d=512, batch=256), dict(d=4096, batch=65536)),
}


def build(name, device="cpu", scale="cpu", dtype=torch.float32, seed=0):
    """Return (model, inputs tuple, loss_fn(output, inputs) -> scalar)."""
    torch.manual_seed(seed)
    kw = dict(SIZES[name][0 if scale == "cpu" else 1])
    B = kw.pop("batch")
    if name == "mlp":
        m, x = MLP(**kw), (torch.randn(B, kw["d"]),)
        loss = lambda out, inp: out.float().pow(2).mean()
    elif name == "gpt":
        m = GPT(**kw)
        idx = torch.randint(0, kw["vocab"], (B, kw["seq"]))
        tgt = torch.randint(0, kw["vocab"], (B, kw["seq"]))
        x = (idx,)
        loss = lambda out, inp, tgt=tgt.to(device): F.cross_entropy(out.float().view(-1, out.size(-1)), tgt.view(-1))
    elif name == "convnet":
        hw = kw.pop("hw")
        m, x = ConvNet(**kw), (torch.randn(B, 3, hw, hw),)
        y = torch.randint(0, 10, (B,))
        loss = lambda out, inp, y=y.to(device): F.cross_entropy(out.float(), y)
    elif name == "normact":
        m, x = NormAct(kw["d"]), (torch.randn(B, kw["d"], requires_grad=True),)
        loss = lambda out, inp: out.float().sum()
    else:
        raise KeyError(name)
    m = m.to(device=device, dtype=dtype)
    x = tuple(t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype).detach()
              .requires_grad_(t.requires_grad) for t in x)
    return m, x, loss


def step(model, inputs, loss_fn):
    """One training step's compute: forward, loss, backward. Returns the loss."""
    out = model(*inputs)
    l = loss_fn(out, inputs)
    l.backward()
    return l.detach()


NAMES = list(SIZES)
