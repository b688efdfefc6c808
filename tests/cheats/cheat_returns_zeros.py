"""Cheat: writes zeros (with a Triton kernel, so it looks like kernel work)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from _kernels import ScaleReluParams, fill  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        return fill(torch.empty_like(x), 0.0)
