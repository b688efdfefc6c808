"""Cheat: right values, but float64 instead of Model's float32."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import ScaleReluParams  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        return self.kernel(x).double()
