import torch
import torch.nn as nn


class Model(nn.Module):
    """A linear layer followed by a ReLU."""
    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        return torch.relu(x)


batch_size = 16
in_features = 32
out_features = 24


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
