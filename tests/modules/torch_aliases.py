"""torch's alias spellings of catalog ops (torch.multiply is torch.mul, .divide() is .div(), ...),
as KernelBench level-2 task 52 writes them: they fuse exactly like the usual spellings."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x, y):
        x = self.conv(x)
        x = torch.multiply(torch.tanh(torch.nn.functional.softplus(x)), x)
        x = torch.subtract(x, 0.5).divide(2.0)
        x = torch.true_divide(x, 3.0).multiply(y).subtract(y)
        return torch.absolute(torch.negative(x)).negative()


batch_size, size = 2, 10


def get_inputs():
    return [torch.randn(batch_size, 3, size, size), torch.randn(batch_size, 8, size - 2, size - 2)]


def get_init_inputs():
    return []
