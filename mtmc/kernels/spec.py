"""KernelSpec: what one kernel must compute, independent of how.

A spec is plain data (JSON-serializable) so it can travel through the LangGraph state, the
checkpointer, a child process and the memory store unchanged.  How to compute it (the Triton
template, the reference, the inputs) lives in the op family named by `family`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

DTYPES = ("float32", "float16", "bfloat16")
# TF32 products (10-bit mantissa) where the user allows them: fp32's tolerance widened this much
# (2**-10 against fp32's 1e-4 bound)
TF32_ERROR_SCALE = 16.0
TF32_FAMILIES = ("conv", "matmul")   # the families whose fp32 products may be TF32


def tf32_applies(family: str, dtype: str) -> bool:
    """Whether a spec of this family and dtype has products TF32 could run (an fp32 conv or matmul)."""
    return family in TF32_FAMILIES and dtype == "float32"
# Not a catalog family: an op outside it whose kernel the coder role's model writes (its params
# hold the PyTorch reference and the inputs' shapes; module.custom_groups, agents.llm_coder).
CUSTOM_FAMILY = "custom"

# Short names people use, mapped to the torch dtype names used everywhere in the code.
DTYPE_ALIASES = {
    "fp32": "float32", "float32": "float32", "float": "float32", "f32": "float32", "single": "float32",
    "fp16": "float16", "float16": "float16", "half": "float16", "f16": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16", "brain float": "bfloat16",
}


@dataclass
class KernelSpec:
    """One kernel to write.

    family: catalog family name ("elementwise", "reduction", "softmax", "norm", "matmul").
    op:     the op inside the family ("sum", "log_softmax", "rmsnorm", "bmm", "chain", ...).
    dims:   named sizes; every family documents its names (rows M and columns N for row ops,
            M, N, K and batch B for matmul).
    dtype:  "float32" | "float16" | "bfloat16" (inputs and output).
    params: op details: the elementwise chain, the matmul epilogue, eps, ...
    request: the words (or module group) this spec came from, for records and explanations.
    """

    family: str
    op: str
    dims: dict[str, int]
    dtype: str = "float32"
    params: dict = field(default_factory=dict)
    request: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "KernelSpec":
        return cls(family=d["family"], op=d["op"], dims={k: int(v) for k, v in d["dims"].items()},
                   dtype=d.get("dtype", "float32"), params=dict(d.get("params", {})),
                   request=d.get("request", ""))

    def with_dims(self, **dims: int) -> "KernelSpec":
        return KernelSpec(self.family, self.op, {**self.dims, **dims}, self.dtype, dict(self.params), self.request)

    def key(self) -> str:
        """Stable id of what is computed (not of the words it was asked in)."""
        body = json.dumps({"family": self.family, "op": self.op, "dims": self.dims,
                           "dtype": self.dtype, "params": self.params}, sort_keys=True)
        return hashlib.sha1(body.encode()).hexdigest()[:12]
