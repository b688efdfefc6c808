"""Cheat for ref_constant_output.py: zeros of the right shape where Model gives ones."""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import fill  # noqa: E402


class ModelNew(nn.Module):
    def forward(self, x):
        return fill(torch.empty(x.shape[0], 1, dtype=x.dtype, device=x.device), 0.0)
