"""Pooling in the forms real code writes it: nn modules, F functions (positional and keyword
arguments, defaults), tensor-free adaptive sizes, a pointwise tail after a pool, and return_indices."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, channels: int = 4):
        super().__init__()
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.avg = nn.AvgPool2d((2, 3), stride=(1, 2), ceil_mode=True, count_include_pad=False, padding=1)
        self.gap = nn.AdaptiveAvgPool2d((1, 1))
        self.amax = nn.AdaptiveMaxPool1d(5)
        self.pool3 = nn.MaxPool3d(2, return_indices=True)

    def forward(self, x, v):
        a = torch.sigmoid(self.pool(x))                       # module + tail
        b = self.avg(x).clamp(min=0.1, max=0.9)               # module + clamp
        c = F.max_pool2d(x, kernel_size=2)                    # F, keyword, default stride
        d = F.avg_pool2d(x, 3, 1, 1)                          # F, positional
        e = self.gap(x).flatten(1)                            # global, adaptive module
        f = F.adaptive_max_pool2d(x, (2, None))               # adaptive with None
        g = self.amax(v)                                      # 1d adaptive
        h = F.max_pool1d(v, 3, stride=2, dilation=2, ceil_mode=True)
        _, i = self.pool3(x.unsqueeze(1))                     # indices only
        return a, b, c, d, e, f, g, h, i


N, C, H, W = 2, 4, 9, 10


def get_inputs():
    return [torch.randn(N, C, H, W), torch.randn(N, C, 2 * W - 3)]


def get_init_inputs():
    return [C]
