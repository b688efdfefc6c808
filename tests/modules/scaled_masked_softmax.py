"""Scaled, causally masked softmax over attention scores (an additive -inf mask)."""
import math

import torch
import torch.nn as nn

batch_size, heads, seq_len = 2, 3, 16


class Model(nn.Module):
    def __init__(self, seq_len, head_dim):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)
        mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, scores):
        return torch.softmax(scores * self.scale + self.mask, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, heads, seq_len, seq_len)]


def get_init_inputs():
    return [seq_len, 64]
