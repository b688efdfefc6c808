import torch
import torch.nn as nn


class Model(nn.Module):
    """Simple model that performs a softmax over the rows."""
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size = 16
dim = 128


def get_inputs():
    return [torch.rand(batch_size, dim) * 4]


def get_init_inputs():
    return []
