import torch
import torch.nn.functional as F


def program(x0):
    v0 = x0.reshape(5, 3)
    v1 = x0.expand(-1, -1)
    v2 = v0[torch.tensor([3], dtype=torch.long)]
    v3 = v0[:, 1:3]
    v4 = torch.log_softmax(v0, 1)
    v5 = v2.squeeze(-2)
    v6 = x0.flatten()
    v7 = v4 - v4
    v8 = torch.lerp(x0, x0, 0.3)
    v9 = torch.relu(v3)
    v10 = torch.cat([v6, v5], dim=0)
    v11 = torch.exp(v7)
    v12 = torch.where(v11 > 0, v2, v11)
    v13 = v6.mean(0, keepdim=False)
    v14 = torch.exp(v4)
    v15 = v12 * v0
    v16 = x0.index_select(0, torch.tensor([0, 1, 1], dtype=torch.long))
    v5.index_put_((torch.tensor([], dtype=torch.long),), v5.new_full((), 0.5), accumulate=True)
    v17 = v15.unsqueeze(-3)
    v18 = v4 / (v15.abs() + 1)
    v19 = v16.mean(-1, keepdim=True)
    v20 = torch.lerp(v13, v8, 0.3)
    v21 = v11.squeeze(-1)
    v22 = x0 @ v19
    v23 = v4.expand(2, -1, -1)
    v24 = v17 / (v5.abs() + 1)
    v25 = v2.clamp(-0.5, 0.5)
    v26 = torch.maximum(v6, v13)
    v27 = torch.where(v4 > 0, x0, v4)
    return (v24, v25, v26, v27,)


def make_inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(12239)
    x0 = torch.randn((1, 1), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype).expand(5, 3).requires_grad_()
    return [x0]


OPTS = {'backend': 'cpp', 'memory_budget': 0.0}
