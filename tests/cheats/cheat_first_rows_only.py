"""Cheat: does only the first half of the rows; the rest is whatever memory held."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import ScaleReluParams  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        return self.kernel(x, rows=x.shape[0] // 2)
