import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.m0 = nn.BatchNorm2d(1)
        self.m1 = nn.BatchNorm2d(1)
        self.m2 = nn.BatchNorm2d(1)
        self.m3 = nn.Conv2d(1, 1, 3, padding=1)

    def forward(self, h):
        h = self.m0(h)
        h = self.m1(h)
        h = self.m2(h)
        h = h + self.m3(h)
        return (h,)

def make_model(dtype=torch.float32):
    torch.manual_seed(0)
    model = Model()
    for m in model.modules():
        if isinstance(m, (nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d)):
            nn.init.normal_(m.weight)
            nn.init.normal_(m.bias)
    return model.to(dtype)

def make_inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn((2, 1, 1, 1), generator=g, dtype=torch.float64).to(dtype)
    return [x]


OPTS = {'backend': 'cpp', 'memory_budget': 0.0}
