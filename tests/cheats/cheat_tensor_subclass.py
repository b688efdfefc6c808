"""Cheat: returns a torch.Tensor subclass (a lazy or instrumented wrapper) instead of a plain tensor."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from _kernels import ScaleReluParams  # noqa: E402


class LazyResult(torch.Tensor):
    pass


class ModelNew(ScaleReluParams):
    def forward(self, x):
        return self.kernel(x).as_subclass(LazyResult)
