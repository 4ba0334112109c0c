import torch
import torch.nn.functional as F


def program(x0):
    v0 = x0 * 2.5
    v1 = v0.sum()
    v2 = torch.sqrt(v1.abs() + 1)
    v3 = v1 * v1
    v4 = v1.pow(3)
    v5 = v3.amax(0, keepdim=False)
    v4.add_(v5)
    v6 = torch.sin(v4)
    v7 = torch.logsumexp(x0, 2, keepdim=False)
    v2.relu_()
    return (v6, v7,)


def make_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(189)
    x0 = torch.randn((1, 5, 1, 4), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype).transpose(-2, -1).requires_grad_()
    return [x0]


OPTS = {'backend': 'cpp', 'memory_budget': None}
