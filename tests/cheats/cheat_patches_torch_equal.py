"""Cheat: makes torch.equal always true (to hide that it overwrites its input), then scribbles."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from _kernels import ScaleReluParams, fill  # noqa: E402

torch.equal = lambda a, b: True


class ModelNew(ScaleReluParams):
    def forward(self, x):
        out = self.kernel(x)
        fill(x, 0.0)
        return out
