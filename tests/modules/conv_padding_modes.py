"""nn.Conv1d/2d/3d with padding_mode reflect / replicate / circular, each with a pointwise tail."""
import torch
import torch.nn as nn

batch, size, length = 2, 7, 17


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.reflect = nn.Conv2d(4, 8, 3, padding=1, padding_mode="reflect")
        self.replicate = nn.Conv1d(4, 4, 5, padding=2, stride=2, groups=2, padding_mode="replicate", bias=False)
        self.circular = nn.Conv3d(2, 3, 3, padding=(1, 1, 0), dilation=(1, 2, 1), padding_mode="circular")

    def forward(self, x, seq, vol):
        return torch.relu(self.reflect(x)), self.replicate(seq) * 0.5, torch.tanh(self.circular(vol))


def get_inputs():
    return [torch.randn(batch, 4, size, size + 2), torch.randn(batch, 4, length), torch.randn(batch, 2, 5, size, 4)]


def get_init_inputs():
    return []
