"""Honest for ref_rounding_zero.py: zeros of the output's shape, written by a Triton kernel."""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import fill  # noqa: E402


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(4, 16)   # Model's state_dict loads into it

    def forward(self, x):
        return fill(torch.empty(x.shape[0], dtype=x.dtype, device=x.device), 0.0)
