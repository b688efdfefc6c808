import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv2d, BatchNorm in eval mode, Scaling, Softmax over a size-1 dim and a channel sum: the
    BatchNorm can fold into the conv's weights (it is in eval mode), the softmax is 1, and the sum
    over the conv's output channels could become a one-channel conv."""

    def __init__(self, in_channels, out_channels, kernel_size, scale):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm2d(out_channels)
        self.bn.eval()
        self.scale = scale

    def forward(self, x):
        y = self.bn(self.conv(x)) * self.scale
        z = self.conv(x).sum(dim=1, keepdim=True)
        w = torch.softmax(z, dim=1)
        return y + z * w


batch_size = 2
in_channels = 3
out_channels = 8
height = 12
width = 12
kernel_size = 3
scale = 0.5


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, scale]
