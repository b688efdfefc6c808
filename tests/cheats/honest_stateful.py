"""Honest: relu(x * weight + bias) by one Triton kernel, plus the state, which it keeps for the
next call as Model does."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import scale_relu  # noqa: E402
from ref_stateful import Model  # noqa: E402


class ModelNew(Model):
    def forward(self, x):
        out = scale_relu(x.contiguous(), self.weight, self.bias) + self.state.to(x.device)
        self.state = out.mean(0).detach()
        return out
