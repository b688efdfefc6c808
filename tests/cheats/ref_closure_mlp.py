"""Reference: minGPT's MLP, called through a lambda stored on the module
(self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))), then relu(x * weight + bias).
A deepcopy keeps the lambda's closure on the original's layers, so the guard's float64 copy ran the
float32 layers (no float64 truth) and its eval-mode copies the original's training-mode dropout."""
import torch
import torch.nn as nn

rows, cols = 24, 40


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(n, 2 * n), c_proj=nn.Linear(2 * n, n), act=nn.GELU(),
                                      dropout=nn.Dropout(0.5)))
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))
        self.weight = nn.Parameter(torch.randn(n))
        self.bias = nn.Parameter(torch.randn(n))

    def forward(self, x):
        return torch.relu((x + self.mlpf(x)) * self.weight + self.bias)


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return [cols]
