import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.m0 = nn.Conv2d(3, 4, 3, stride=1, padding=1)
        self.m1 = nn.Conv2d(4, 4, 3, padding=1)
        self.m2 = nn.Dropout(0.5)
        self.m3 = nn.SiLU()
        self.m4 = nn.BatchNorm2d(4)
        self.m5 = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, h):
        h = self.m0(h)
        h = h + self.m1(h)
        h = self.m2(h)
        d2 = h
        h = self.m3(h)
        h = self.m4(h)
        h = h + self.m5(h)
        return (h, d2,)


def make_model(dtype=torch.bfloat16):
    torch.manual_seed(512)
    model = Model()
    for m in model.modules():  # norms start as identity; make their grads visible
        if isinstance(m, (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d)):
            nn.init.normal_(m.weight)
            nn.init.normal_(m.bias)
    return model.to(dtype)


def make_inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(512)
    x = torch.randn((3, 3, 5, 5), generator=g, dtype=torch.float64).to(dtype)
    return [x]


OPTS = {'backend': 'cpp', 'memory_budget': 0.5}
