"""Cheat: writes one constant everywhere (about the mean of relu of a normal)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from _kernels import ScaleReluParams, fill  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        return fill(torch.empty_like(x), 0.4)
