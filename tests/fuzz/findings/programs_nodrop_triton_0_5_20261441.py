import torch
import torch.nn.functional as F


def program(x0, x1, x2):
    v0 = torch.gather(x1, 0, torch.tensor([], dtype=torch.long).reshape(0, 1))
    v1 = torch.log_softmax(v0, -1)
    v2 = torch.softmax(v1, 0)
    v3 = x0[torch.tensor([4], dtype=torch.long)]
    v4 = torch.lerp(x2, v3, 0.3)
    v5 = torch.log_softmax(v2, 0)
    return (v4, v5,)


def make_inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(152)
    x0 = torch.randn((1, 3), generator=g, dtype=torch.float64)
    x0 = x0.to(dtype).expand(5, 3).requires_grad_()
    x1 = torch.randn((5, 3), generator=g, dtype=torch.float64)
    x1.view(-1)[8] = float('-inf')
    x1.view(-1)[11] = float('inf')
    x1 = x1.to(dtype).requires_grad_()
    x2 = torch.randn((3, 3), generator=g, dtype=torch.float64)
    x2 = x2.to(dtype).transpose(-2, -1)
    return [x0, x1, x2]


OPTS = {'backend': 'triton', 'memory_budget': 0.5}
