"""A convolution's geometry in names: the spatial dims of each rank, transposed or not, and which
epilogue steps read a per-channel vector.  Shared by the conv family and its template renderer
(kernels.families._conv_render), which import it, not each other, and by the pool family."""
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


def validate_channel_epilogue(params: dict, what: str) -> list[dict]:
    """The epilogue of params, checked: pointwise steps whose operands are full tensors, [C]
    vectors (per channel) or one value ({'scalar': true}), never broadcast (periodic) ones; `what`
    names the op in messages."""
    epi = params.get("epilogue", [])
    if not isinstance(epi, list):
        raise ValueError(f"the {what} epilogue must be a list of pointwise steps")
    pointwise.validate_chain(epi)
    if pointwise.uses_periodic(epi):
        raise ValueError(f"{what} epilogues take full or per-channel operands ({{'channel': true}}), "
                         "not broadcast (periodic) ones")
    if any(is_channel_step(s) and pointwise.is_scalar(s) for s in epi):
        raise ValueError(f"a {what} epilogue step reads a [C] vector or one value, not both; got {epi}")
    return epi
