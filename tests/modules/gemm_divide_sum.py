import torch
import torch.nn as nn


class Model(nn.Module):
    """Matmul with a transposed weight, Divide, Sum, Scaling (KernelBench level 2 style): the sum
    over the output features moves before the matmul, through the divide (a GEMV)."""

    def __init__(self, input_size, hidden_size, scaling_factor):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden_size, input_size) * 0.02)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = torch.matmul(x, self.weight.T)
        x = x / 2
        x = torch.sum(x, dim=1, keepdim=True)
        x = x * self.scaling_factor
        return x


batch_size = 256
input_size = 2048
hidden_size = 2048
scaling_factor = 1.5


def get_inputs():
    return [torch.rand(batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, scaling_factor]
