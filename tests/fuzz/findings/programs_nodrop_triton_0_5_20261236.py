import torch
import torch.nn.functional as F


def program(x0, x1, x2):
    v0 = torch.log1p(x0.abs())
    v1 = x2.pow(3)
    v2 = torch.logsumexp(v1, 0, keepdim=True)
    v3 = v2 * v1
    v4 = torch.rsqrt(v0 * v0 + 1)
    v5 = torch.where(x1 > 0, v3, x1)
    v6 = -x2
    v7 = v4.index_put((torch.tensor([0, 2, 3], dtype=torch.long),), x1, accumulate=False)
    v8 = v0.reshape(1, 5)
    v9 = v2 @ v2
    return (v6, v7, v8, v9,)


def make_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(11293)
    x0 = torch.randn((10,), generator=g, dtype=torch.float64)
    x0.view(-1)[2] = float('inf')
    x0.view(-1)[6] = float('-inf')
    x0 = x0.to(dtype)[..., ::2].requires_grad_()
    x1 = torch.randn((), generator=g, dtype=torch.float64)
    x1 = x1.to(dtype).requires_grad_()
    x2 = torch.randn((5,), generator=g, dtype=torch.float64)
    x2 = x2.to(dtype).requires_grad_()
    return [x0, x1, x2]


OPTS = {'backend': 'triton', 'memory_budget': 0.5}
