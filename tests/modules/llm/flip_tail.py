"""A flip in the middle of a chain: torch.flip is outside the kernel catalog, so it stays PyTorch
unless a model writes its kernel (issue 18's coder role inside an uploaded module)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        y = torch.relu(x) * 2.0
        y = torch.flip(y, [-1])
        return y + 1.0


def get_inputs():
    return [torch.randn(8, 48)]


def get_init_inputs():
    return []
