"""Honest for ref_relu_of_rand.py: one Triton kernel computes relu (scale 1, bias 0)."""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import scale_relu  # noqa: E402


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        ones = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
        return scale_relu(x, ones, torch.zeros_like(ones))
