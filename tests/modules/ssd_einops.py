"""A Mamba2-style segment sum (KernelBench L3 48/49 at toy size): einops.rearrange of inputs and
parameters, a causal mask built by a factory from traced sizes and device
(torch.ones(T, T, device=x.device, dtype=bool)), cumsum, exp and an einsum.  Capture records the
einops calls and the factory as graph nodes instead of failing on them."""
import torch
import torch.nn as nn
from einops import rearrange


class Model(nn.Module):
    def __init__(self, heads, length, block_len, batch):
        super().__init__()
        self.A = nn.Parameter(torch.randn(batch, length, heads))
        self.block_len = block_len

    def segsum(self, x):
        T = x.size(-1)
        x_cumsum = torch.cumsum(x, dim=-1)
        x_segsum = x_cumsum[..., :, None] - x_cumsum[..., None, :]
        mask = torch.tril(torch.ones(T, T, device=x.device, dtype=bool), diagonal=0)
        return x_segsum.masked_fill(~mask, -torch.inf)

    def forward(self, X):
        X_blocks, A_blocks = [rearrange(x, "b (c l) ... -> b c l ...", l=self.block_len) for x in (X, self.A)]
        A_blocks = rearrange(A_blocks, "b c l h -> b h c l")
        L = torch.exp(self.segsum(A_blocks))
        return torch.einsum("bhcls,bcshp->bclhp", L, X_blocks)


batch_size, seq_length, n_heads, d_head, block_len = 2, 12, 3, 5, 4


def get_inputs():
    return [torch.rand(batch_size, seq_length, n_heads, d_head)]


def get_init_inputs():
    return [n_heads, seq_length, block_len, batch_size]
