"""The op vocabulary, defined once: which ops each family of the catalog serves.

Plain data with no imports, so the words parser (mtmc.request) reads it without loading any
Triton template; each family (kernels.families.*) takes its `ops` from here, and the pointwise
steps a chain or an epilogue may hold are kernels.pointwise's UNARY / SCALAR / BINARY / VECTOR.
"""
from __future__ import annotations

FAMILY_OPS: dict[str, tuple[str, ...]] = {
    "elementwise": ("chain",),
    "reduction": ("sum", "mean", "max", "min", "argmax", "argmin"),
    "softmax": ("softmax", "log_softmax"),
    "norm": ("layernorm", "rmsnorm"),
    "matmul": ("matmul", "bmm"),
    "attention": ("sdpa",),
    "conv": ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"),
}
