import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.m0 = nn.BatchNorm2d(4)
        self.m1 = nn.BatchNorm2d(4)
        self.m2 = nn.BatchNorm2d(4)

    def forward(self, h):
        h = self.m0(h)
        h = self.m1(h)
        h = self.m2(h)
        return (h,)


def make_model(dtype=torch.float32):
    torch.manual_seed(1)
    model = Model()
    for m in model.modules():  # norms start as identity; make their grads visible
        if isinstance(m, (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d)):
            nn.init.normal_(m.weight)
            nn.init.normal_(m.bias)
    return model.to(dtype)


def make_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    x = torch.randn((2, 4, 1, 1), generator=g, dtype=torch.float64).to(dtype)
    return [x]


OPTS = {'backend': 'triton', 'memory_budget': 0.5}
