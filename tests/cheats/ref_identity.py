"""Reference whose output is its input: no tolerance can tell a copy of the input from it."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 1.0


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return []
