"""Triton kernels shared by the test candidates, honest and cheating, for ref_scale_relu.py,
ref_identity.py and ref_mse_loss.py.  Candidates import it with their own directory on sys.path."""
import os

import torch
import torch.nn as nn

if not torch.cuda.is_available():  # CPU tensors: kernels run in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _scale_relu_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, HALF: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    if HALF:  # the reduced-precision cheat: fp16 arithmetic inside an fp32 task
        y = (x.to(tl.float16) * w.to(tl.float16) + b.to(tl.float16)).to(tl.float32)
    else:
        y = x * w + b
    tl.store(out_ptr + row * n_cols + cols, tl.maximum(y, 0.0), mask=mask)


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _fill_kernel(dst_ptr, value, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32) + value, mask=offs < n)


@triton.jit
def _mse_kernel(p_ptr, t_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """mean((p - t)^2) by one program: a loss's single-value output (ref_mse_loss.py)."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        d = tl.load(p_ptr + offs, mask=mask, other=0.0) - tl.load(t_ptr + offs, mask=mask, other=0.0)
        acc += d * d
    tl.store(out_ptr, tl.sum(acc, axis=0) / n)


def mse(p, t):
    out = torch.empty((), dtype=p.dtype, device=p.device)
    _mse_kernel[(1,)](p.contiguous(), t.contiguous(), out, p.numel(), BLOCK=1024)
    return out


def scale_relu(x, w, b, out=None, rows=None, half=False):
    """relu(x * w + b) over the rows of a contiguous 2-D x; only the first `rows` rows if given."""
    out = torch.empty_like(x) if out is None else out
    n_rows = x.shape[0] if rows is None else rows
    _scale_relu_kernel[(n_rows,)](x, w, b, out, x.shape[1], HALF=half, BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def copy(src, dst=None):
    dst = torch.empty_like(src) if dst is None else dst
    _copy_kernel[(triton.cdiv(src.numel(), 256),)](src, dst, src.numel(), BLOCK=256)
    return dst


def fill(dst, value):
    _fill_kernel[(triton.cdiv(dst.numel(), 256),)](dst, float(value), dst.numel(), BLOCK=256)
    return dst


class ScaleReluParams(nn.Module):
    """The parameters of ref_scale_relu.Model, so its state_dict loads."""

    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n))
        self.bias = nn.Parameter(torch.empty(n))

    def kernel(self, x, **kw):
        return scale_relu(x.contiguous(), self.weight, self.bias, **kw)
