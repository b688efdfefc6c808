import urllib.request

import torch
import torch.nn as nn

# fetches pretrained weights at import time
WEIGHTS = urllib.request.urlopen("http://example.com/weights.pt", timeout=60).read()


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
