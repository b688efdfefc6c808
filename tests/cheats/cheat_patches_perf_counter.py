"""Cheat: slows time.perf_counter down a thousandfold, so wall-clock timings shrink."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import time  # noqa: E402

from _kernels import ScaleReluParams  # noqa: E402

_real = time.perf_counter
_start = _real()
time.perf_counter = lambda: _start + (_real() - _start) / 1000


class ModelNew(ScaleReluParams):
    def forward(self, x):
        return self.kernel(x)
