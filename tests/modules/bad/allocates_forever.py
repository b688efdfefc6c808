import torch
import torch.nn as nn

_cache = []
while True:  # a "cache" that never stops growing
    _cache.append(torch.empty(2 ** 28))


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
