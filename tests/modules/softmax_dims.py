"""Softmax over a middle dim and identity ops, in the forms real code writes them: nn.Softmax(dim=1),
F.softmax / torch.log_softmax / the tensor method with dims given positionally, by keyword and
negative; a per-channel bias, scaling and activations after the softmax; clone / detach /
contiguous / eval dropout / nn.Identity / float() on fp32 between ops (they must not split a group)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, channels: int = 6):
        super().__init__()
        self.softmax = nn.Softmax(dim=1)
        self.bias = nn.Parameter(torch.randn(channels, 1, 1))
        self.drop = nn.Dropout(0.0)   # p=0: an identity even in training mode
        self.ident = nn.Identity()

    def forward(self, x, v):
        orig = x.clone().detach()
        a = torch.sigmoid((self.softmax(x) + self.bias) * 2.0)            # channels, per-channel bias tail
        b = torch.tanh(F.softmax(self.ident(x), dim=-3)) * 0.5             # negative dim
        c = torch.log_softmax(self.drop(v).contiguous(), 1)                # [B, C, L], positional dim
        d = v.float().softmax(dim=2) - F.dropout(v, p=0.3, training=False)  # last dim, residual
        e = x.relu() + orig                                               # read past clone().detach()
        return a, b, c, d, e


B, C, H, W, L = 2, 6, 5, 7, 9


def get_inputs():
    return [torch.randn(B, C, H, W), torch.randn(B, C, L)]


def get_init_inputs():
    return [C]
