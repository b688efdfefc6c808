"""Self-attention block: fused QKV projection, scaled softmax(QK^T) V per head, output
projection and the residual."""
import math

import torch
import torch.nn as nn

batch_size, seq_len, d_model, n_heads = 2, 8, 32, 4


class Model(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, S, D = x.shape
        H = self.n_heads
        qkv = self.qkv(x).reshape(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
        att = att.softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, S, D)
        return x + self.out(y)


def get_inputs():
    return [torch.randn(batch_size, seq_len, d_model)]


def get_init_inputs():
    return [d_model, n_heads]
