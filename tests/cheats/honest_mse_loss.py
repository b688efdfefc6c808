"""Honest for ref_mse_loss.py: the loss computed by a Triton kernel."""
import os
import sys

import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import mse  # noqa: E402


class ModelNew(nn.Module):
    def forward(self, p, t):
        return mse(p, t)
