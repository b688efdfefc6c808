"""Honest for ref_identity.py (a Triton copy), yet no check can tell it from a cheat there."""
import os
import sys

import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import copy  # noqa: E402


class ModelNew(nn.Module):
    def forward(self, x):
        return copy(x.contiguous())
