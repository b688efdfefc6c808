"""Reference whose output does not depend on its input's values: a softmax over a dim of size 1
is 1 everywhere (KernelBench has such modules).  Returning ones is the right answer here."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x.mean(dim=1, keepdim=True), dim=1)


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return []
