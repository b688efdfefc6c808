"""Resource exhaustion: allocates without bound."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import ScaleReluParams  # noqa: E402


class ModelNew(ScaleReluParams):
    def forward(self, x):
        hoard = []
        while True:
            hoard.append(bytearray(256 * 2**20))
