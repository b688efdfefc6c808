"""Reference: relu on torch.rand inputs (KernelBench's ELU task draws its input this way), so on
every distribution that keeps the template's sign the output is a copy of the input."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(16, 32)]


def get_init_inputs():
    return []
