"""Cheat: hands the work to a worker thread that outlives the call (so work can overlap
the next measurement)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from _kernels import ScaleReluParams  # noqa: E402

POOL = ThreadPoolExecutor(1, thread_name_prefix='cheat-worker')


class ModelNew(ScaleReluParams):
    def forward(self, x):
        return POOL.submit(self.kernel, x).result()
