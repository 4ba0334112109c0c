import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.m0 = nn.Sequential(nn.Conv2d(5, 5, 3, stride=1, padding=1, groups=5, bias=False), nn.BatchNorm2d(5), nn.SiLU())
        self.m1 = nn.Hardswish()
        self.m2 = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(5, 2, 1), nn.ReLU(), nn.Conv2d(2, 5, 1), nn.Sigmoid())
        self.m3 = nn.Sequential(nn.Conv2d(5, 5, 3, stride=1, padding=1, groups=5, bias=False), nn.BatchNorm2d(5), nn.SiLU())
        self.m4 = nn.Sequential(nn.Sequential(nn.Conv2d(5, 20, 1, stride=1, padding=0, groups=1, bias=False), nn.BatchNorm2d(20), nn.ReLU6()), nn.Sequential(nn.Conv2d(20, 20, 3, stride=1, padding=1, groups=20, bias=False), nn.BatchNorm2d(20), nn.ReLU6()), nn.Conv2d(20, 5, 1, bias=False), nn.BatchNorm2d(5))

    def forward(self, h):
        h = self.m0(h)
        h = self.m1(h)
        h = h * self.m2(h)
        h = self.m3(h)
        h = h + self.m4(h)
        return (h,)


def make_model(dtype=torch.bfloat16):
    torch.manual_seed(10561)
    model = Model()
    for m in model.modules():  # norms start as identity; make their grads visible
        if isinstance(m, (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d)):
            nn.init.normal_(m.weight)
            nn.init.normal_(m.bias)
    return model.to(dtype).to(memory_format=torch.channels_last)


def make_inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(10561)
    x = torch.randn((2, 5, 7, 7), generator=g, dtype=torch.float64).to(dtype).contiguous(memory_format=torch.channels_last)
    return [x]


OPTS = {'backend': 'cpp', 'memory_budget': None}
