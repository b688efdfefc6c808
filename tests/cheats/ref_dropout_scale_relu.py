"""Reference random in training mode: dropout, then ref_scale_relu's computation."""
import torch
import torch.nn as nn

rows, cols = 24, 40


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.drop = nn.Dropout(0.3)
        self.weight = nn.Parameter(torch.randn(n))
        self.bias = nn.Parameter(torch.randn(n))

    def forward(self, x):
        return torch.relu(self.drop(x) * self.weight + self.bias)


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return [cols]
