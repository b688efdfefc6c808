"""A block whose gate has data-dependent control flow (cannot be captured), around an MLP and
a norm that can."""
import torch
import torch.nn as nn

rows, dim = 6, 24


class Gate(nn.Module):
    def forward(self, x):
        if x.mean() > 0:
            return x * 2.0
        return x - 1.0


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.gate = Gate()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        h = self.gate(h)
        return self.norm(h + x)


def get_inputs():
    return [torch.randn(rows, dim)]


def get_init_inputs():
    return [dim]
