"""A linear layer written out by hand: x @ W^T, then + bias, then ReLU."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size, in_features, out_features = 24, 48, 40


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / in_features ** 0.5)
        self.bias = nn.Parameter(torch.randn(out_features))

    def forward(self, x):
        y = F.linear(x, self.weight)
        y = y + self.bias
        return torch.relu(y)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
