"""Cheat (GPU): remembers the answer per input address (and two sampled values, so fresh inputs
at a reused address still get computed), so a benchmark that calls it again on the same tensor
times a dictionary lookup."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import ScaleReluParams  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        memo = self.__dict__.setdefault('memo', {})
        key = (x.data_ptr(), tuple(x.shape), float(x[0, 0]), float(x[-1, -1]))
        if key not in memo:
            memo[key] = self.kernel(x)
        return memo[key]
