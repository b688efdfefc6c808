"""Crash (GPU): a Triton kernel stores to a wild device address, which breaks the process's CUDA
context ("an illegal memory access was encountered"); the verdict must say crashed."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from _kernels import ScaleReluParams  # noqa: E402  (sets TRITON_INTERPRET on CPU before triton loads)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _wild_store(p):
    tl.store(p + (1 << 40), 1.0)


class ModelNew(ScaleReluParams):
    def forward(self, x):
        _wild_store[(1,)](x)
        torch.cuda.synchronize()
        return x.clone()
