import torch
import torch.nn.functional as F


def program(x0):
    v0 = torch.lerp(x0, x0, 0.3)
    v1 = torch.lerp(x0, v0, 0.3)
    v2 = v0.reshape(1, 5)
    v3 = -x0
    v4 = v1.expand(3, -1)
    v5 = v1.squeeze(-1)
    v6 = F.dropout(v3, p=0.1)
    v7 = v4.flatten()
    v8 = v0.select(0, -5)
    v9 = x0.clamp(-0.5, 0.5)
    v7.mul_(0.5)
    v10 = F.linear(v6, v4)
    v11 = v0.var(0, keepdim=False)
    v12 = v5.reshape(5, 1)
    v3.add_(v9)
    v13 = v12 * v11
    v14 = torch.softmax(v10, 0)
    v15 = v3.index_put((torch.tensor([4, 1, 0], dtype=torch.long),), v11, accumulate=False)
    v16 = v10.reshape(1, 3)
    v17 = v13 @ v2
    v18 = v8 + v14
    v19 = v10.index_select(0, torch.tensor([2, 1], dtype=torch.long))
    v20 = v0.abs()
    v21 = v6.sum()
    v22 = torch.sin(v20)
    v23 = v6 / (v6.abs() + 1)
    return (v19, v21, v22, v23, v6,)


def make_inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(65535)
    x0 = torch.randn((10,), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype)[..., ::2].requires_grad_()
    return [x0]


OPTS = {'backend': 'cpp', 'memory_budget': 0.0}
