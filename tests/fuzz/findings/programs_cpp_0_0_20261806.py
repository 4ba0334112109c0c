import torch
import torch.nn.functional as F


def program(x0, x1, x2):
    v0 = torch.cumsum(x0, -1)
    v1 = x2 * 2.5
    v2 = torch.where(v1 > 0, v0, v1)
    v3 = v2.flatten()
    v4 = torch.lerp(v1, v3, 0.3)
    v5 = v3 - v2
    v5.add_(v3)
    v6 = v2 - v5
    v7 = x2 * v5
    v8 = torch.lerp(x1, v5, 0.3)
    v9 = v3 / (v8.abs() + 1)
    v10 = v6.pow(3)
    v11 = torch.relu(v6)
    v12 = torch.erf(v1)
    v13 = torch.gather(v9, 0, torch.tensor([0, 0, 0], dtype=torch.long))
    v14 = torch.log(torch.exp(v1) + 1)
    v15 = torch.sigmoid(v14)
    v16 = F.dropout(x0, p=0.3)
    v17 = F.dropout(v9, p=0.9)
    v18 = torch.lerp(v11, v17, 0.3)
    v19 = torch.lerp(v6, v9, 0.3)
    v20 = v17.flatten()
    v20.add_(v9)
    v21 = v0 / (x2.abs() + 1)
    v22 = torch.lerp(v11, v11, 0.3)
    v23 = v11 @ v22
    v24 = x1.flatten()
    v25 = torch.log_softmax(v10, 0)
    v26 = F.gelu(v3)
    v27 = v19 @ v26
    v28 = F.dropout(v7, p=0.9)
    return (v23, v24, v25, v27, v16, v17, v28,)


def make_inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(439)
    x0 = torch.randn((), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype).requires_grad_()
    x1 = torch.randn((), generator=g, dtype=torch.float64)
    x1 = x1.to(dtype)
    x2 = torch.randn((), generator=g, dtype=torch.float64)
    x2 = x2.to(dtype).requires_grad_()
    return [x0, x1, x2]


OPTS = {'backend': 'cpp', 'memory_budget': 0.0}
