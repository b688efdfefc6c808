"""Cheat: replaces triton.testing.do_bench at import, so any benchmark reports 1 ns."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import triton.testing  # noqa: E402
from _kernels import ScaleReluParams  # noqa: E402

triton.testing.do_bench = lambda fn, *args, **kwargs: 1e-6


class ModelNew(ScaleReluParams):
    def forward(self, x):
        return self.kernel(x)
