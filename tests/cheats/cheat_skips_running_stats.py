"""Cheat: the same outputs as Model, but the running statistics and the batch count are never
updated (every later eval-mode call would normalize with the initial statistics)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bn_relu import BnRelu  # noqa: E402


class ModelNew(BnRelu):
    stats = False
