import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.m0 = nn.ReLU()
        self.m1 = nn.BatchNorm2d(1)
        self.m2 = nn.Sequential(nn.Conv2d(1, 1, 3, stride=1, padding=1, groups=1, bias=False), nn.BatchNorm2d(1), nn.ReLU())
        self.m3 = nn.Sequential(nn.Conv2d(1, 1, 3, stride=1, padding=1, groups=1, bias=False), nn.BatchNorm2d(1), nn.SiLU())
        self.m4 = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, h):
        h = self.m0(h)
        h = self.m1(h)
        h = self.m2(h)
        h = self.m3(h)
        h = self.m4(h)
        return (h,)


def make_model(dtype=torch.float32):
    torch.manual_seed(190)
    model = Model()
    for m in model.modules():  # norms start as identity; make their grads visible
        if isinstance(m, (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d)):
            nn.init.normal_(m.weight)
            nn.init.normal_(m.bias)
    return model.to(dtype)


def make_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(190)
    x = torch.randn((4, 1, 8, 8), generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    return [x]


OPTS = {'backend': 'cpp', 'memory_budget': None}
