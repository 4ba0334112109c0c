import torch
import torch.nn.functional as F


def program(x0, x1):
    v0 = x1.abs()
    v1 = torch.erf(x1)
    v2 = torch.log_softmax(x1, 0)
    v3 = x0.amax(-1, keepdim=True)
    return (v0, v1, v2, v3,)


def make_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn((3,), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype).requires_grad_()
    x1 = torch.randn((), generator=g, dtype=torch.float64)
    x1 = x1.to(dtype).requires_grad_()
    return [x0, x1]


OPTS = {'backend': 'triton', 'memory_budget': None}
