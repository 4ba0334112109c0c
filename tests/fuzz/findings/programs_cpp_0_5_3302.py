import torch
import torch.nn.functional as F


def program(x0, x1):
    v0 = x1[:, :, :, :1]
    s0 = x1.argmin()
    v1 = F.hardtanh(x1, -0.3, 0.7)
    v2 = -torch.tanh(v0.flip(-4)) * torch.sin(v0)
    v3 = x1.index_select(3, torch.tensor([0, 0, 0, 0], dtype=torch.long))
    v4 = x1.var((0, 1, 2, 3), keepdim=True)
    v5 = v1.index_put((torch.tensor([], dtype=torch.long),), v1.new_full((), 2.0), accumulate=True)
    v6 = x0 @ x0.transpose(-2, -1)
    v7 = v6.unsqueeze(0) @ v6.transpose(-2, -1)
    v8 = v2 @ v4
    v9 = x0.mean((2, 3), keepdim=True)
    v10 = torch.maximum(v2, x1) - torch.minimum(v2, x1)
    v7[1::3] = v6
    v11 = -x1
    v12 = torch.rsqrt(v11 * v11 + 1)
    v13 = torch.log_softmax(torch.softmax(v8, 2), -4)
    v14 = torch.softmax(x0, 0)
    v12.index_put_((torch.tensor([0, 0, 0], dtype=torch.long),), v12.new_full((), 0.5), accumulate=True)
    v15 = x0.select(3, -8)
    v16 = torch.hypot(v13, v9)
    v17 = v15.var(-1, keepdim=False)
    return (v10, v14, v16, v17, s0,)


def make_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(14026)
    x0 = torch.randn((3, 1, 9, 7), generator=g, dtype=torch.float64)
    x0 = x0 * 1e+19
    x0.view(-1)[88] = float('1.5')
    x0.view(-1)[21] = float('1e30')
    x0.view(-1)[47] = float('-0.0')
    x0 = x0.to(dtype).transpose(-2, -1).requires_grad_()
    x1 = torch.randn((1, 1, 7, 2), generator=g, dtype=torch.float64)
    x1 = x1.to(dtype)[..., ::2].requires_grad_()
    return [x0, x1]



OPTS = {'backend': 'cpp', 'memory_budget': 0.5}
