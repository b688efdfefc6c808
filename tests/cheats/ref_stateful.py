"""Reference: relu(x * weight + bias) + state, where the forward keeps `state` for the next call
(as KernelBench's VanillaRNNHidden keeps self.hidden): deterministic, but two calls on the same
inputs differ, so the guard must not take it for a random Model."""
import torch
import torch.nn as nn

rows, cols = 24, 40


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n))
        self.bias = nn.Parameter(torch.randn(n))
        self.state = torch.zeros(n)

    def forward(self, x):
        out = torch.relu(x * self.weight + self.bias) + self.state.to(x.device)
        self.state = out.mean(0).detach()
        return out


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return [cols]
