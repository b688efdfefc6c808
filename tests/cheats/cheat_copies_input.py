"""Cheat: a Triton copy of the input instead of the computation."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import ScaleReluParams, copy  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        return copy(x.contiguous())
