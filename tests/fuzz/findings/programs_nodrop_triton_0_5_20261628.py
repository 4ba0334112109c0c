import torch
import torch.nn.functional as F


def program(x0):
    v0 = torch.lerp(x0, x0, 0.3)
    v1 = v0.expand(2, -1, -1, -1, -1)
    v2 = v1.pow(3)
    v3 = torch.relu(x0)
    return (v2, v3,)


def make_inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(968)
    x0 = torch.randn((5, 4, 4, 5), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype).transpose(-2, -1).requires_grad_()
    return [x0]


OPTS = {'backend': 'cpp', 'memory_budget': 0.5}
