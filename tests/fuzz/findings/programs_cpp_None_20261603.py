import torch
import torch.nn.functional as F


def program(x0, x1, x2):
    v0 = F.leaky_relu(x1, 0.2)
    v1 = torch.relu(x1)
    v2 = F.embedding(torch.tensor([0, 0, 0, 0, 0, 0, 0, 0, 0], dtype=torch.long).reshape(3, 3), x2)
    v3 = torch.lerp(x2, x2, 0.3)
    v4 = v2[:, :, :0:3]
    v5 = x0 + 1.5
    v6 = torch.cat([v3, v3], dim=0)
    v7 = x0.var(0, keepdim=True)
    v8 = F.dropout(v2, p=0.5)
    v2[:, :, :0:2] = v7
    v9 = v5[torch.tensor([], dtype=torch.long)]
    return (v1, v4, v6, v9, v8,)


def make_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(121)
    x0 = torch.randn((1, 2), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype).transpose(-2, -1).requires_grad_()
    x1 = torch.randn((1, 1), generator=g, dtype=torch.float64)
    x1 = x1.to(dtype).expand(0, 5)
    x2 = torch.randn((1, 0), generator=g, dtype=torch.float64)
    x2 = x2.to(dtype).expand(1, 0)
    return [x0, x1, x2]


OPTS = {'backend': 'cpp', 'memory_budget': None}
