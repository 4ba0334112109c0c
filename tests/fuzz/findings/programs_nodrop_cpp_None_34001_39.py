import torch
import torch.nn.functional as F


def program(x0, x1, x2):
    v0 = x2 @ x2.transpose(-2, -1).unsqueeze(0).expand(2, *x2.shape[:-2], x2.shape[-1], x2.shape[-2])
    v1 = torch.maximum(x2, x2)
    v2 = F.hardsigmoid(x1)
    v3 = F.silu(x2)
    v4 = torch.lerp(v0, v0, 0.3)
    return (v1, v2, v3, v4,)


def make_inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(61393)
    x0 = torch.randn((5, 1, 1, 9), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype).requires_grad_()
    x1 = torch.randn((1, 1, 1, 9), generator=g, dtype=torch.float64)
    x1 = x1.to(dtype).expand(5, 1, 1, 9).requires_grad_()
    x2 = torch.randn((1, 1), generator=g, dtype=torch.float64)
    x2.view(-1)[0] = float('1e30')
    x2.view(-1)[0] = float('nan')
    x2.view(-1)[0] = float('-inf')
    x2 = x2.to(dtype).expand(9, 7).requires_grad_()
    return [x0, x1, x2]


OPTS = {'backend': 'cpp', 'memory_budget': None}
