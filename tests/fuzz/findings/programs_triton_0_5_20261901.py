import torch
import torch.nn.functional as F


def program(x0, x1, x2):
    v0 = x1.flatten()
    v1 = torch.cumsum(x2, -1)
    v2 = v0 * v0
    v3 = x0[:, :, :, 1::3]
    v4 = torch.maximum(v0, v0)
    v5 = torch.exp(v3)
    v6 = x2 * v2
    v7 = v0 @ v4
    v8 = x1.sum(-1, keepdim=True)
    v9 = v5 * v5
    v10 = v9 @ v9.transpose(-2, -1)
    v11 = torch.sin(v10)
    v12 = torch.where(v11 > 0, v11, v11)
    v13 = v8 * v8
    v14 = v8 + v7
    v15 = v10 * v14
    v16 = torch.tanh(v15)
    v17 = v15.mean(0, keepdim=False)
    v18 = v14.sum(0, keepdim=False)
    v19 = v8 + 1.5
    v20 = v14 * 2.5
    v21 = v14 + v20
    v22 = v11 + v1
    v23 = torch.tanh(v19)
    v24 = torch.tanh(v11)
    v25 = torch.tanh(v24)
    v26 = torch.tanh(v23)
    v27 = torch.log1p(v9.abs())
    v28 = torch.tanh(v25)
    v29 = v23.mean(0, keepdim=False)
    v30 = torch.log(torch.exp(v21) + 1)
    v31 = F.gelu(v30)
    v32 = v31 * v31
    v33 = torch.log_softmax(v5, 0)
    v34 = F.silu(v33)
    v35 = torch.tanh(v31)
    v36 = torch.softmax(v24, 0)
    return (v32, v34, v35, v36,)


def make_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(697)
    x0 = torch.randn((3, 3, 3, 1), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype)
    x1 = torch.randn((3, 3, 3, 1), generator=g, dtype=torch.float64)
    x1 = x1.to(dtype)
    x2 = torch.randn((1, 3, 1, 1), generator=g, dtype=torch.float64)
    x2 = x2.to(dtype).requires_grad_()
    return [x0, x1, x2]


OPTS = {'backend': 'triton', 'memory_budget': 0.5}
