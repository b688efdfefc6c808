"""torch.where / masked_fill forms and two-tensor formulas: each line should be one kernel."""
import torch
import torch.nn as nn
import torch.nn.functional as F

shape = (4, 6, 33)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("causal", torch.tril(torch.ones(shape[1], shape[1]))[None])

    def forward(self, x, y, z, mask):
        a = torch.where(x > 0, x, x * 0.2)                       # select on one value
        b = torch.where(0.5 < torch.abs(y), torch.tanh(y), 1.0)   # number on the left, number branch
        c = x.masked_fill(mask, 0.0) * 2.0                         # a bool input mask
        s = y @ z.transpose(-2, -1)                                 # scores, then a broadcast mask
        s = s.masked_fill(self.causal == 0, float("-inf"))
        d = torch.where(mask, z, -1.0).relu()
        e = torch.relu(x) + torch.relu(y)                          # two branches, one kernel
        f = x * torch.sigmoid(y)
        g = (x - y).abs() * z
        h = torch.where(mask, x, y)                                # two tensor branches: stays PyTorch
        return a + b, c, F.softmax(s, dim=-1), d, e, f, g, h


def get_inputs():
    return [torch.randn(*shape), torch.randn(*shape), torch.randn(*shape), torch.rand(*shape) < 0.5]


def get_init_inputs():
    return []
