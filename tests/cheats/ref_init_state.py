"""Reference: relu(x * weight + bias) + offset, where `offset` is drawn by the constructor and kept
outside the state_dict (as KernelBench's LSTM tasks keep h0 = torch.randn(...)): ModelNew gets the
same offset only when it is built under Model's seed, as KernelBench's harness builds both."""
import torch
import torch.nn as nn

rows, cols = 24, 40


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n))
        self.bias = nn.Parameter(torch.randn(n))
        self.offset = torch.randn(n)

    def forward(self, x):
        return torch.relu(x * self.weight + self.bias) + self.offset.to(x.device)


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return [cols]
