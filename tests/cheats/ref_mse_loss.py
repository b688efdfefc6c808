"""Reference whose only output is one number, a loss: mean((p - t)^2) of two normals is about 2
on every draw of the same distribution, so only the guard's other input variants tell a kernel
that returns 2 from one that computes it."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, p, t):
        return torch.mean((p - t) ** 2)


def get_inputs():
    return [torch.randn(64, 96), torch.randn(64, 96)]


def get_init_inputs():
    return []
