"""Cheat (GPU): runs the kernel on a side stream and returns without waiting, so a timer on
the default stream sees almost nothing."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from _kernels import ScaleReluParams  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            return self.kernel(x)
