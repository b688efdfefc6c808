"""The op vocabulary, defined once: which ops each family of the catalog serves.

Plain data with no imports, so the words parser (mtmc.request) reads it without loading any
Triton template; each family (kernels.families.*) takes its `ops` from here, and the pointwise
steps a chain or an epilogue may hold are kernels.pointwise's UNARY / SCALAR / BINARY / VECTOR.
"""
from __future__ import annotations

FAMILY_OPS: dict[str, tuple[str, ...]] = {
    "elementwise": ("chain",),
    "reduction": ("sum", "mean", "max", "min", "argmax", "argmin", "prod", "logsumexp", "var"),
    "softmax": ("softmax", "log_softmax"),
    "norm": ("layernorm", "rmsnorm", "l2norm", "l1norm", "frobenius", "batchnorm", "groupnorm", "instancenorm"),
    "matmul": ("matmul", "bmm"),
    "attention": ("sdpa",),
    "conv": ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"),
    "pool": tuple(f"{kind}_pool{r}d" for kind in ("max", "avg", "adaptive_max", "adaptive_avg") for r in (1, 2, 3)),
    "scan": ("cumsum", "cumprod"),
    "loss": ("mse", "l1", "smooth_l1", "huber", "kl_div", "hinge_embedding", "total",
             "cross_entropy", "triplet_margin", "cosine_similarity", "cosine_embedding"),
}
