"""Reference for GPU tests: ref_scale_relu at 8192 x 8192 fp32 (512 MB moved per call)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_scale_relu import Model  # noqa: E402,F401

rows, cols = 8192, 8192


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return [cols]
