"""Cheat (or bug): never returns."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import ScaleReluParams  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        while True:
            pass
