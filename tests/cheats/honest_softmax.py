"""Honest: mtmc's own softmax template, rendered for the input's shape on first use."""
import torch
import torch.nn as nn

from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.tools.hardware import resolve
from mtmc.tools.loader import load_source


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._launch = {}

    def forward(self, x):
        key = (tuple(x.shape), str(x.dtype))
        if key not in self._launch:
            spec = KernelSpec("softmax", "softmax", {"M": x.shape[0], "N": x.shape[1]}, str(x.dtype).removeprefix("torch."))
            fam = family_of(spec)
            self._launch[key] = load_source(fam.render(spec, fam.default_config(spec, resolve("h200"))), "softmax").launch
        out = torch.empty_like(x)
        self._launch[key](x.contiguous(), out=out)
        return out
