"""Batched matmul with a scaled, residual epilogue: (a @ b) * 0.5 + c, then ReLU."""
import torch
import torch.nn as nn

batch, m, k, n = 3, 20, 24, 28


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b, c):
        return torch.relu(torch.bmm(a, b) * 0.5 + c)


def get_inputs():
    return [torch.randn(batch, m, k), torch.randn(batch, k, n), torch.randn(batch, m, n)]


def get_init_inputs():
    return []
