"""Linear, x * sigmoid(x) by hand (both operand orders), scaling: one matmul with its epilogue."""
import torch
import torch.nn as nn

batch_size, in_features, out_features, scaling_factor = 6, 40, 24, 2.0


class Model(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.matmul(x)
        x = x * torch.sigmoid(x)
        x = x * self.scaling_factor
        return x.sigmoid() * x


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scaling_factor]
