"""Honest: Model's MLP through its own lambda, then relu(x * weight + bias) by one Triton kernel."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import scale_relu  # noqa: E402
from ref_closure_mlp import Model  # noqa: E402


class ModelNew(Model):
    def forward(self, x):
        return scale_relu((x + self.mlpf(x)).contiguous(), self.weight, self.bias)
