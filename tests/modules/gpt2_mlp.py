"""GPT-2's MLP as Hugging Face writes it: Conv1D layers (torch.addmm of a bias, the flattened input
and a [in, out] weight), the tanh GELU between them, and a beta != 1 addmm (a matmul whose epilogue
adds the scaled input)."""
import math

import torch
import torch.nn as nn

batch_size, seq_len, n_embd = 2, 5, 32


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = nn.Parameter(torch.randn(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class Model(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = Conv1D(4 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, 4 * n_embd)

    def forward(self, x):
        h = self.c_fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        out = self.c_proj(h)
        return out, torch.addmm(out[0], x[0], self.c_proj.weight[:n_embd], beta=0.5)


def get_inputs():
    return [torch.randn(batch_size, seq_len, n_embd)]


def get_init_inputs():
    return [n_embd]
