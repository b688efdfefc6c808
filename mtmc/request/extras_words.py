"""Row ops over other dims in words (a phase and a builder of request.parse).

"softmax over dim 1 of a 16x64x56x56 fp32 tensor", "log softmax along the channel dim of a
32x128x64x64 tensor" (the channel dim is dim 1, NCHW), "sum of all elements of a 8192x8192
tensor" (one result: the reduction family's split kernel).

`read_extras` runs with the other op phases and takes "the channel dim" as dim 1 (it was read as
no axis at all, so the softmax silently ran over the last dim).  `extras_builder` picks the
builder once the op is known: a softmax over a dim that is not the last is the softmax words'
own spec (request.build: scale, temperature, chains) re-laid as [outer, dim, inner] (params
"inner", read in place); a reduction over all elements is request.pointred_words' reduction
over every dim.
"""
from __future__ import annotations

import math

from mtmc.request.build import _build_softmax, _one_shape, _x
from mtmc.request.pointred_words import build_reduction
from mtmc.request.reading import _Ctx
from mtmc.request.words import is_symbolic, symbolic_axis

_CHANNEL_DIM = r"\b(?:over|along|across)\s+(?:the\s+)?channels?(?:\s+(?:dim|dimension|axis))?\b"


def read_extras(ctx: _Ctx) -> None:
    for _ in ctx.take(_CHANNEL_DIM):
        ctx.reduce_dim = 1
        ctx.understood["axis"] = "channels (dim 1)"


def extras_builder(ctx: _Ctx, family: str):
    """The builder for a row op over other dims, or None (the usual builder serves it)."""
    d = ctx.reduce_dim
    if is_symbolic(d) and _one_shape(ctx) is not None:   # numbers from here on
        ctx.reduce_dim = d = symbolic_axis(ctx, len(_one_shape(ctx)))
    if family == "reduction" and d == "all elements":
        ctx.reduce_dim = "all dims"
        return build_reduction
    if family == "softmax" and isinstance(d, int) and not isinstance(d, bool):
        shape = _one_shape(ctx)
        if shape is not None and len(shape) > 1 and -len(shape) <= d < len(shape) and d % len(shape) != len(shape) - 1:
            return build_softmax_dim
    return None


def build_softmax_dim(ctx: _Ctx, op: str):
    shape = _one_shape(ctx)
    d = ctx.reduce_dim % len(shape)
    ctx.reduce_dim = "last"   # the softmax words' own spec first, then its layout
    spec = _build_softmax(ctx, op)
    ctx.reduce_dim = d
    ctx.understood["context"] = [f"{op} over dim {d} of {_x(shape)}, read in place as "
                                 f"[{math.prod(shape[:d])}, {shape[d]}, {math.prod(shape[d + 1:])}]"]
    spec.dims = {"M": math.prod(shape) // shape[d], "N": shape[d]}
    spec.params["inner"] = math.prod(shape[d + 1:])   # an [N] bias runs along dim d (the kernel's columns)
    return spec
