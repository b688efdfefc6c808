import time

import torch
import torch.nn as nn

while True:  # e.g. waiting for a server that never answers
    time.sleep(0.5)


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
