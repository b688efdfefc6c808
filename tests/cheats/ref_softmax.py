"""Reference: softmax over the rows of a 12x50 fp32 tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(12, 50)]


def get_init_inputs():
    return []
