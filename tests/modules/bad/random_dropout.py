import torch
import torch.nn as nn


class Model(nn.Module):
    """Dropout in training mode: two runs never agree, so no ModelNew can be checked."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return torch.relu(self.drop(x)) * 2.0


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
