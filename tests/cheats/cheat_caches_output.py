"""Cheat: computes once, then replays the first answer on every later call."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import ScaleReluParams, copy  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        if not hasattr(self, 'cached'):
            self.cached = self.kernel(x)
        return copy(self.cached)
