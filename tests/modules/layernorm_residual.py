"""Post-norm residual block: LayerNorm(x + dropout(proj(x))), dropout off."""
import torch
import torch.nn as nn

batch_size, seq_len, hidden = 4, 6, 64


class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)
        self.drop = nn.Dropout(0.0)
        self.norm = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, x, residual):
        h = self.drop(self.proj(x))
        return self.norm(residual + h)


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden), torch.randn(batch_size, seq_len, hidden)]


def get_init_inputs():
    return [hidden]
