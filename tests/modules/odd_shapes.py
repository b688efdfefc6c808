"""Deliberately odd shapes: primes everywhere, a 3-D batch, and a row sum over 37 columns."""
import torch
import torch.nn as nn

dims = (3, 7, 37)
out_features = 53


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features)

    def forward(self, x):
        y = torch.sigmoid(self.fc(x)) * 2.0 - 0.5
        y = self.norm(y)
        return y, x.square().sum(dim=-1, keepdim=True)


def get_inputs():
    return [torch.randn(*dims)]


def get_init_inputs():
    return [dims[-1], out_features]
