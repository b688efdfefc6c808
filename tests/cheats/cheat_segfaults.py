"""Crash: reads address 0 (what an out-of-bounds kernel does to a process)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ctypes  # noqa: E402

from _kernels import ScaleReluParams  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        return ctypes.string_at(0)
