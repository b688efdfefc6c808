"""Reference whose domain is non-negative: sqrt of torch.rand inputs (NaN on negative values)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.sqrt(x) * 2.0


def get_inputs():
    return [torch.rand(16, 32)]


def get_init_inputs():
    return []
