"""Reference whose true output is 0 on every input: the mean of a group-normed tensor over its
channels and positions (KernelBench L2 23, Conv3d + GroupNorm + mean).  Eager PyTorch gives its
rounding, ~1e-8; float64 gives ~1e-17.  Returning zeros is the right answer here."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(4, 16)

    def forward(self, x):
        return self.norm(x).mean(dim=[1, 2])


def get_inputs():
    return [torch.randn(8, 16, 32)]


def get_init_inputs():
    return []
