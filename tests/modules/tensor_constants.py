"""Tensors made from Python numbers inside forward (KernelBench L2 31: torch.min(x, torch.tensor(c)));
a 0-d one in a binop reads as its number, so the whole chain is one kernel."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, constant_value=0.5, scaling_factor=2.0):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.constant_value = constant_value
        self.bias = nn.Parameter(torch.randn(8, 1, 1))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.conv(x)
        x = torch.min(x, torch.tensor(self.constant_value))
        x = x + self.bias
        x = torch.maximum(x, torch.tensor(-0.25)) - torch.tensor(1.5)
        return x * self.scaling_factor


batch_size = 2
size = 10


def get_inputs():
    return [torch.randn(batch_size, 3, size, size)]


def get_init_inputs():
    return [0.5, 2.0]
