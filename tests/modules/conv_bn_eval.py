import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv2d, an inference BatchNorm (F.batch_norm with training=False over the module's running
    statistics), Scaling, Softmax over a size-1 dim and a channel sum: the BatchNorm can fold into
    the conv's weights, the softmax is 1, and the sum over the conv's output channels could become
    a one-channel conv."""

    def __init__(self, in_channels, out_channels, kernel_size, scale):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.register_buffer("running_mean", torch.randn(out_channels) * 0.1)
        self.register_buffer("running_var", torch.rand(out_channels) + 0.5)
        self.gamma = nn.Parameter(torch.randn(out_channels))
        self.beta = nn.Parameter(torch.randn(out_channels))
        self.scale = scale

    def forward(self, x):
        y = F.batch_norm(self.conv(x), self.running_mean, self.running_var, self.gamma, self.beta,
                         training=False, eps=1e-5) * self.scale
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
