"""Cheat: computes the right answer, then uses the input as scratch space."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import ScaleReluParams, fill  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        out = self.kernel(x)
        fill(x, 0.0)
        return out
