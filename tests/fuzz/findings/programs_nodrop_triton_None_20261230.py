import torch
import torch.nn.functional as F


def program(x0, x1, x2):
    v0 = x2 * x2
    v1 = x1 + v0
    v2 = torch.tanh(v1)
    v3 = F.gelu(x2)
    v4 = -v3
    return (v2, v4,)


def make_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn((), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype).requires_grad_()
    x1 = torch.randn((), generator=g, dtype=torch.float64)
    x1 = x1.to(dtype).requires_grad_()
    x2 = torch.randn((), generator=g, dtype=torch.float64)
    x2 = x2.to(dtype)
    return [x0, x1, x2]


OPTS = {'backend': 'triton', 'memory_budget': None}
