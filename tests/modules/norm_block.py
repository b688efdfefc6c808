"""Normalizations in their module and function forms: BatchNorm2d in training mode (its running
buffers updated), BatchNorm1d with momentum=None, F.batch_norm with running statistics in eval
form, GroupNorm with a pointwise tail, InstanceNorm1d (affine), LayerNorm and RMSNorm over two
trailing dims, x / torch.norm(x, p='fro'), F.normalize, x / x.norm(p=2, dim=1, keepdim=True) and
x / x.abs().sum(-1, keepdim=True)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch, channels, height, width, groups = 2, 6, 5, 7, 3


class Model(nn.Module):
    def __init__(self, channels, groups):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)
        self.gn = nn.GroupNorm(groups, channels)
        self.inorm = nn.InstanceNorm1d(channels, affine=True)
        self.ln = nn.LayerNorm([height, width])
        self.rms = nn.RMSNorm([height, width], eps=1e-5)
        self.bn1 = nn.BatchNorm1d(channels * height, momentum=None)
        self.register_buffer("mean", torch.linspace(-0.5, 0.5, channels))
        self.register_buffer("var", torch.linspace(0.5, 2.0, channels))

    def forward(self, x):
        a = self.bn(x)
        b = torch.relu(self.gn(a)) * 0.5
        c = self.inorm(b.flatten(2)).view_as(x)
        d = self.rms(self.ln(c))
        e = F.batch_norm(d, self.mean, self.var, training=False, eps=1e-3)
        f = e / torch.norm(e, p="fro")
        g = self.bn1(f.flatten(1, 2)).flatten(1)
        h = F.normalize(g, dim=1)
        i = h / h.norm(p=2, dim=1, keepdim=True)
        return i / torch.sum(torch.abs(i), dim=-1, keepdim=True) + 1.0


def get_inputs():
    return [torch.randn(batch, channels, height, width) * 2 + 1]


def get_init_inputs():
    return [channels, groups]
