"""Honest: the batch norm by PyTorch, its running statistics updated as Model's, the relu by one
Triton kernel."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bn_relu import BnRelu  # noqa: E402


class ModelNew(BnRelu):
    stats = True
