"""Cheat: no kernel at all; ModelNew is the reference in PyTorch."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_scale_relu import Model  # noqa: E402


class ModelNew(Model):
    pass
