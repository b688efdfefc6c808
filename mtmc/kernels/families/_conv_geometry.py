"""A convolution's geometry in names: the spatial dims of each rank, transposed or not, and which
epilogue steps read a per-channel vector.  Shared by the conv family and its template renderer
(kernels.families._conv_render), which import it, not each other."""
from __future__ import annotations

from mtmc.kernels import pointwise

SPATIAL = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}


def rank(op: str) -> int:
    return int(op[-2])


def is_transposed(op: str) -> bool:
    return op.startswith("conv_transpose")


def out_names(op: str) -> tuple[str, ...]:
    return tuple("O" + s for s in SPATIAL[rank(op)])


def is_channel_step(step: dict) -> bool:
    """A step whose operand is a [C_out] vector: the bias, or a step marked "channel"."""
    return step["op"] in pointwise.VECTOR or (step["op"] in pointwise.BINARY and bool(step.get("channel")))
