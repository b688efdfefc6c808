"""Pooling head: mean and max over the sequence dim of |x|, concatenated, then a classifier."""
import torch
import torch.nn as nn

batch_size, seq_len, hidden, classes = 3, 12, 16, 5


class Model(nn.Module):
    def __init__(self, hidden, classes):
        super().__init__()
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, x):
        a = x.abs()
        mean = a.mean(dim=1)
        mx, _ = torch.max(a, dim=1)
        return self.head(torch.cat([mean, mx], dim=-1))


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden)]


def get_init_inputs():
    return [hidden, classes]
