"""Reference: relu(BatchNorm1d(x)) in training mode: the call also moves the running statistics
and the batch count, which every later eval-mode call reads."""
import torch
import torch.nn as nn

rows, cols = 24, 40


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.bn = nn.BatchNorm1d(n)

    def forward(self, x):
        return torch.relu(self.bn(x))


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return [cols]
