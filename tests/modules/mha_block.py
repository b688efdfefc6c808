"""nn.MultiheadAttention self-attention over image pixels with a residual LayerNorm (KernelBench
level 3 #31 at a small size): the in- and out-projections become matmul groups, the core an
attention group."""
import torch
import torch.nn as nn

embed_dim, num_heads, batch_size, height, width = 32, 2, 2, 4, 5


class Model(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x):
        B, C, H, W = x.shape
        x = x.view(B, C, H * W).permute(2, 0, 1)
        attn_output, _ = self.attn(x, x, x)
        x = self.norm(attn_output + x)
        return x.permute(1, 2, 0).view(B, C, H, W)


def get_inputs():
    return [torch.rand(batch_size, embed_dim, height, width)]


def get_init_inputs():
    return [embed_dim, num_heads]
