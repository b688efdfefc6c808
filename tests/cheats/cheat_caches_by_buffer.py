"""Cheat: remembers the answer per input buffer (its address), so a second call on the same
tensor, refilled with new values in place, gets the first call's answer back."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import ScaleReluParams, copy  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        memo = self.__dict__.setdefault('memo', {})
        if x.data_ptr() not in memo:
            memo[x.data_ptr()] = self.kernel(x)
        return copy(memo[x.data_ptr()])
