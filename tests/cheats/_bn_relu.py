"""relu(batch_norm(x)) with the relu in a Triton kernel; `stats` says whether the running
statistics are handed to F.batch_norm (and so updated)."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernels import scale_relu  # noqa: E402
from ref_batchnorm import Model  # noqa: E402


class BnRelu(Model):
    stats = True

    def forward(self, x):
        bn = self.bn
        if self.stats and bn.training:
            bn.num_batches_tracked.add_(1)
        y = F.batch_norm(x, bn.running_mean if self.stats else None, bn.running_var if self.stats else None,
                         bn.weight, bn.bias, bn.training, bn.momentum, bn.eps)
        ones, zeros = torch.ones_like(bn.weight), torch.zeros_like(bn.bias)
        return scale_relu(y.contiguous(), ones, zeros)
