import torch
import torch.nn.functional as F


def program(x0):
    v0 = x0.reshape(1, 1)
    v1 = F.leaky_relu(v0, 0.2)
    v2 = x0 - x0
    v3 = torch.sin(v2)
    v4 = F.embedding(torch.tensor([0], dtype=torch.long), v1)
    v5 = v2 * v2
    v6 = F.silu(x0)
    v1.index_put_((torch.tensor([], dtype=torch.long),), v1.new_full((), 0.5), accumulate=True)
    v7 = x0.permute(2, 1, 0)
    v5.mul_(0.5)
    v8 = v4 * v5
    v9 = v2 @ v2
    v10 = v3 * 2.5
    v11 = v1 + v9
    v12 = v8.flip(0)
    v13 = torch.log1p(v2.abs())
    v14 = v12.expand(2, 3, 3, 2)
    v15 = F.linear(v5, v0)
    v16 = v14.index_put((torch.tensor([1, 0], dtype=torch.long),), v15, accumulate=True)
    v17 = x0.sum()
    v18 = torch.sin(v12)
    v19 = v2[torch.tensor([0], dtype=torch.long)]
    v20 = 1 / (x0.abs() + 1)
    v21 = torch.cumsum(v3, -1)
    v22 = -x0
    v23 = v20.flip(2)
    v24 = torch.maximum(v9, v14)
    return (v21, v22, v23, v24,)


def make_inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(10353)
    x0 = torch.randn((1, 1, 1), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype).expand(1, 1, 1).requires_grad_()
    return [x0]


OPTS = {'backend': 'triton', 'memory_budget': 0.0}
