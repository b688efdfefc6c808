"""Cheat: launches a token Triton kernel, then does the real work in PyTorch."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from _kernels import ScaleReluParams, fill  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        fill(torch.empty(8, device=x.device), 1.0)
        return torch.relu(x * self.weight + self.bias)
