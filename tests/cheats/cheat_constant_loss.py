"""Cheat for ref_mse_loss.py: returns 2.0, the loss's value on two standard normals, whatever
the inputs."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from _kernels import fill  # noqa: E402


class ModelNew(nn.Module):
    def forward(self, p, t):
        return fill(torch.empty((), dtype=p.dtype, device=p.device), 2.0)
