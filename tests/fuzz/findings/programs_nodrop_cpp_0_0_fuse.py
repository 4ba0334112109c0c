import torch
import torch.nn.functional as F


def program(x0):
    v0 = 1 / (x0.abs() + 1)
    v1 = v0[torch.tensor([], dtype=torch.long)]
    v2 = torch.tanh(v0)
    v3 = torch.log(torch.exp(v2) + 1)
    v4 = torch.sin(v1)
    v5 = torch.rsqrt(v3 * v3 + 1)
    v6 = v3.sum()
    v7 = torch.relu(v5)
    v8 = v7[torch.tensor([], dtype=torch.long)]
    v9 = torch.relu(v3)
    v10 = v3 - v3
    v11 = v7 / (v6.abs() + 1)
    v12 = v11 - v6
    v13 = torch.tanh(v12)
    v14 = v3.flatten()
    v15 = v12.transpose(0, 3)
    v16 = torch.tanh(v13)
    v17 = torch.log(torch.exp(v16) + 1)
    v18 = torch.tanh(v17)
    v9.index_put_((torch.tensor([], dtype=torch.long),), v9.new_full((), 0.5), accumulate=True)
    v19 = v15 - v18
    v20 = v8 @ v8.transpose(-2, -1)
    v21 = -v18
    v22 = torch.lerp(v20, v20, 0.3)
    v22[:, :, :0] = v22
    v23 = v15.flatten()
    v24 = torch.where(v23 > 0, v23, v23)
    v25 = v19.flatten()
    v26 = torch.where(v25 > 0, v25, 0.1 * v25)
    v27 = v11 / (v16.abs() + 1)
    v28 = v24.var(0, keepdim=False)
    v29 = torch.tanh(v26)
    return (v21, v27, v28, v29,)


def make_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(65536)
    x0 = torch.randn((4, 3, 1, 4), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype).requires_grad_()
    return [x0]


OPTS = {'backend': 'cpp', 'memory_budget': 0.0}
