"""Cheat: computes in place into the input and returns a view of it (no allocation)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import ScaleReluParams  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        self.kernel(x, out=x)
        return x.view(x.shape)
