"""Scans in the forms modules write them: torch.cumsum with a pointwise tail, a reverse cumsum
(flip, scan, flip), x.cumprod, a masked cumsum (x * a bool mask), an exclusive cumsum (cumsum
minus x, or the cumsum of x shifted by one with a zero first, as KernelBench's exclusive cumsum
task writes it) and a cumsum over a middle dim."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x, mask, y):
        a = torch.relu(torch.cumsum(x * 0.5, dim=self.dim))
        b = torch.cumsum(x.flip(self.dim), self.dim).flip(self.dim)
        c = (y * 0.1 + 1.0).cumprod(dim=-1)
        d = torch.cumsum(x * mask, dim=1)
        e = torch.cumsum(y, dim=-1) - y
        f = torch.cumsum(x.reshape(4, 3, -1), dim=1)
        shifted = torch.cat((torch.zeros_like(y.select(self.dim, 0).unsqueeze(self.dim)), y), dim=self.dim)
        g = torch.cumsum(shifted.narrow(self.dim, 0, y.size(self.dim)), dim=self.dim)
        return a, b, c, d, e, f, g


batch_size = 12
length = 100


def get_inputs():
    x = torch.rand(batch_size, length)
    return [x, torch.rand(batch_size, length) > 0.5, torch.randn(batch_size, length)]


def get_init_inputs():
    return [1]
