import torch
import torch.nn.functional as F


def program(x0, x1):
    v0 = x1.permute(2, 1, 0, 3)
    v1 = x1[torch.tensor([0], dtype=torch.long)]
    v2 = v1 + v0
    v3 = v2 * v2
    v4 = torch.lerp(v3, v2, 0.3)
    v5 = torch.sin(v4)
    v6 = torch.tanh(v5)
    v7 = torch.sigmoid(v5)
    v8 = torch.sigmoid(v4)
    v9 = torch.exp(v5)
    v10 = v9.reshape(17, 17, 2)
    v11 = torch.sin(v10)
    return (v6, v7, v8, v11,)


def make_inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(1168)
    x0 = torch.randn((1, 1, 17, 4), generator=g, dtype=torch.float64)
    x0 = x0 * 1e+19
    x0 = x0.to(dtype)[..., ::2].requires_grad_()
    x1 = torch.randn((1, 1, 17, 4), generator=g, dtype=torch.float64)
    x1 = x1 * 1e+19
    x1 = x1.to(dtype)[..., ::2].requires_grad_()
    return [x0, x1]


OPTS = {'backend': 'cpp', 'memory_budget': None}
