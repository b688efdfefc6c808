"""Convolutions as kernels: Conv2d (stride 2) then a per-channel scale and ReLU in its epilogue, a
functional depthwise conv ("same" padding), and a ConvTranspose2d whose epilogue adds a skip
tensor and applies tanh."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size, in_ch, mid_ch, out_ch, height, width = 2, 3, 8, 4, 9, 10


class Model(nn.Module):
    def __init__(self, in_ch, mid_ch, out_ch):
        super().__init__()
        self.conv = nn.Conv2d(in_ch, mid_ch, 3, stride=2, padding=1)
        self.scale = nn.Parameter(torch.rand(mid_ch, 1, 1) + 0.5)
        self.depthwise = nn.Parameter(torch.randn(mid_ch, 1, 3, 3) * 0.3)
        self.mid_ch = mid_ch
        self.up = nn.ConvTranspose2d(mid_ch, out_ch, 3, stride=2, padding=1, output_padding=1, bias=False)

    def forward(self, x, skip):
        y = F.relu(self.conv(x) * self.scale)
        y = F.conv2d(y, self.depthwise, padding="same", groups=self.mid_ch)
        return torch.tanh(self.up(y) + skip)


def get_inputs():
    # the stride-2 conv halves each side (rounding up), the transposed conv doubles it back
    skip = (batch_size, out_ch, 2 * ((height + 1) // 2), 2 * ((width + 1) // 2))
    return [torch.randn(batch_size, in_ch, height, width), torch.randn(*skip)]


def get_init_inputs():
    return [in_ch, mid_ch, out_ch]
