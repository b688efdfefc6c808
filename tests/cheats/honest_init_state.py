"""Honest: Model's own constructor (so its offset is drawn as Model draws it), relu(x * weight +
bias) by one Triton kernel, then the offset added."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import scale_relu  # noqa: E402
from ref_init_state import Model  # noqa: E402


class ModelNew(Model):
    def forward(self, x):
        return scale_relu(x.contiguous(), self.weight, self.bias) + self.offset.to(x.device)
