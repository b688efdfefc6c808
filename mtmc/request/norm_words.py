"""Batch, group and instance norms and L1 / L2 / Frobenius normalization in words -> the norm
family's spec (a phase and a builder of request.parse).

"batch norm on a 64x64x512x512 fp32 tensor", "batchnorm in eval mode on 32x128x56x56 bf16",
"group norm with 8 groups on 16x64x128x128 fp16, then relu", "instance norm on 8x32x64x64",
"l2 normalize the rows of a 32768x65535 tensor", "frobenius norm normalization of 112x64x512x512".

`read_norm` runs right after the dtype phase: when the request names one of these norms it takes
the norm's own words (the op, "N groups", "momentum 0.1", "eval mode" / "running statistics",
"affine") and adds the norm core item; the input's shape, eps and the pointwise steps after it
are read by the usual phases.  `build_norm` makes the spec: a channel norm's input is
[N, C, *spatial] (S is the spatial sizes' product), a row normalization's [..., N]; steps after
the norm are its epilogue.  Stated defaults: training mode (batch statistics) for batch norm,
eps 1e-5 (0 for L1 / L2 / Frobenius, as x / x.norm(...)), affine for batch / group norm only.
"""
from __future__ import annotations

import math

from mtmc.kernels.families.norm import FAMILY
from mtmc.kernels.spec import KernelSpec
from mtmc.request.phrases import _AFFINE, _NO_AFFINE
from mtmc.request.build import _around_core, _dtype, _row_spec, _steps, _values, _x
from mtmc.request.conv_words import channels_agree, spatial_input
from mtmc.request.reading import _Ctx, _Fail, _Item, _rx

_OPS = [  # (pattern, op); specific before general
    (r"\bbatch[\s_-]*norm(?:ali[sz]ation)?(?:[\s_-]*[123]d)?\b|\bbn\b", "batchnorm"),
    (r"\bgroup[\s_-]*norm(?:ali[sz]ation)?\b", "groupnorm"),
    (r"\binstance[\s_-]*norm(?:ali[sz]ation)?(?:[\s_-]*[123]d)?\b", "instancenorm"),
    (r"\bfrobenius(?:[\s_-]+norm(?:ali[sz]ation|ali[sz]e)?)?(?:[\s_-]+normali[sz](?:ation|e))?\b", "frobenius"),
    (r"\bl2[\s_-]*(?:norm(?:ali[sz]ation|ali[sz]ed?)?)(?:[\s_-]+normali[sz](?:ation|e))?\b"
     r"|\bnormali[sz]e\w*\s+(?:by\s+|with\s+)?(?:the\s+)?l2(?:[\s_-]+norm)?\b", "l2norm"),
    (r"\bl1[\s_-]*(?:norm(?:ali[sz]ation|ali[sz]ed?)?)(?:[\s_-]+normali[sz](?:ation|e))?\b"
     r"|\bnormali[sz]e\w*\s+(?:by\s+|with\s+)?(?:the\s+)?l1(?:[\s_-]+norm)?\b", "l1norm"),
]
CHANNEL_OPS = ("batchnorm", "groupnorm", "instancenorm")
OPS = tuple(op for _, op in _OPS)
_N = r"\d+(?![\w.])"


# "the L2 norm of each row": the norms themselves (one value per row), not a normalization
_NORM_VALUE = (r"\b(?P<p>l2|l1|2|1|euclidean|manhattan)[\s_-]*norms?\s+of\s+(?:each|every|all\s+the|the)\s+"
               r"(?:rows?|vectors?)\b")


def _norm_values(ctx: _Ctx) -> bool:
    """The norm of each row as a sum reduction: of squares then a square root (L2), of absolute
    values (L1).  Only where the request does not also normalize (divide by it)."""
    if _rx(r"normali|\bdivid").search(ctx.norm):
        return False
    found = ctx.take(_NORM_VALUE)
    if not found:
        return False
    m = found[0]
    l2 = m.group("p") in ("l2", "2", "euclidean")
    ctx.items.append(_Item(m.start(), m.end(), m.group(0).strip(), family="reduction", op="sum"))
    ctx.items.append(_Item(m.start() + 0.001, m.end(), m.group(0).strip(), step={"op": "square" if l2 else "abs"},
                           formula=True, pre=True))
    if l2:
        ctx.items.append(_Item(m.end() + 0.001, m.end(), m.group(0).strip(), step={"op": "sqrt"}, formula=True))
    ctx.reduce_dim = "last"
    ctx.note("ops", f"{m.group(0).strip()!r} -> {'sqrt of the sum of squares' if l2 else 'sum of absolute values'}"
                    " over each row (the norms; 'normalize' divides by them)")
    return True


def read_norm(ctx: _Ctx) -> None:
    """Take a norm request's own words (nothing when it names none of these norms)."""
    if _norm_values(ctx):
        return
    found = [(m, op) for pattern, op in _OPS for m in ctx.take(pattern)]
    if not found:
        return
    if len({op for _, op in found}) > 1:
        raise _Fail(f"the request names {' and '.join(sorted({op for _, op in found}))}; one kernel computes one.")
    words: dict = {}
    ctx.norm_words = words
    for m in ctx.take(rf"\b(?P<v>{_N})\s+groups\b|\b(?:num[\s_-]*)?groups?\s*(?:=|:|of)?\s*(?P<w>{_N})"):
        words["groups"] = ctx.to_int(m.group("v") or m.group("w"))
        ctx.note("norm", m.group(0).strip())
    for m in ctx.take(r"\bmomentum\s*(?:=|:|of)?\s*(?P<v>none|\d*\.?\d+(?:e-?\d+)?)"):
        words["momentum"] = None if m.group("v") == "none" else float(m.group("v"))
        ctx.note("norm", m.group(0).strip())
    for m in ctx.take(r"\b(?:in\s+)?(?:eval(?:uation)?|inference)(?:[\s_-]+mode)?\b"
                      r"|\b(?:with|using|from)\s+(?:the\s+)?running\s+(?:stat\w*|mean\s+and\s+var\w*)"):
        words["training"] = False
        ctx.note("norm", m.group(0).strip())
    for m in ctx.take(r"\b(?:in\s+)?training(?:[\s_-]+mode)?\b|\b(?:with\s+)?batch\s+stat\w*"):
        words.setdefault("training", True)
        ctx.note("norm", m.group(0).strip())
    for m in ctx.take(_NO_AFFINE):   # the layer norm words' own phrases
        ctx.flags.add("no_affine")
        ctx.note("norm", m.group(0).strip())
    for m in ctx.take(_AFFINE):
        words["affine"] = True
        ctx.note("norm", m.group(0).strip())
    m, op = min(found, key=lambda f: f[0].start())
    ctx.items.append(_Item(m.start(), m.end(), m.group(0).strip(), family="norm", op=op))
    ctx.note("ops", f"{m.group(0).strip()!r} -> {op}")


def build_norm(ctx: _Ctx, op: str) -> KernelSpec:
    words = getattr(ctx, "norm_words", {})
    core, pre, post = _around_core(ctx)
    params: dict = dict(_values(ctx, "norm", "eps"))
    if "eps" in params and params["eps"] < 0:
        raise _Fail(f"eps must be >= 0, got {params['eps']:g}.")
    if op not in CHANNEL_OPS:   # over rows (the last dim), or every element (Frobenius)
        if pre and op == "frobenius":
            raise _Fail(f"'{pre[0].words}' comes before the Frobenius normalization; its kernel fuses ops after "
                        "it (its epilogue) only.")
        if pre:
            params["prologue"] = _steps(pre)
        if post:
            params["epilogue"] = _steps(post)
        return _checked(_row_spec(ctx, "norm", op, params))
    if pre:
        raise _Fail(f"'{pre[0].words}' comes before the {op}; its kernel fuses ops after it (its epilogue) only.")
    shapes = sorted(ctx.shapes, key=len, reverse=True)
    if not shapes or len(shapes[0]) < 2:
        raise _Fail(f"a {op} needs its input's shape as N x C [x spatial sizes] (e.g. 16x64x56x56).")
    if len(shapes) > 1:
        raise _Fail(f"I found several shapes ({', '.join(map(_x, ctx.shapes))}); a {op} takes one input.")
    x = shapes[0]
    if "batch" in ctx.sizes and "channels" in ctx.sizes and len(x) <= 3:
        # "batch 16, 64 channels, 128x128 images": the input in words, as a conv's or a pool's
        x, _ = spatial_input(ctx, None, op, "16x64x56x56", "give the input as N x C x H x W")
    channels_agree(ctx, x, op)
    if op == "instancenorm" and len(x) < 3:
        raise _Fail(f"an instance norm needs spatial sizes after N x C; {_x(x)} has none.")
    if post:
        params["epilogue"] = _steps(post)
    if "no_affine" in ctx.flags:
        params["affine"] = False
    elif words.get("affine") or op != "instancenorm":
        params["affine"] = True
    if op == "groupnorm":
        if "groups" not in words:
            raise _Fail("a group norm needs its number of groups, e.g. 'group norm with 8 groups'.")
        params["groups"] = words["groups"]
    elif "groups" in words:
        raise _Fail(f"groups belong to a group norm, not a {op}.")
    if op == "batchnorm":
        params["training"] = words.get("training", True)
        if "training" not in words:
            ctx.assume("batch norm in training mode (batch statistics), as a module is by default")
        if "momentum" in words:
            params["momentum"] = words["momentum"]
    elif "training" in words or "momentum" in words:
        raise _Fail(f"training mode and momentum belong to a batch norm, not a {op}.")
    spec = KernelSpec("norm", op, {"N": x[0], "C": x[1], "S": math.prod(x[2:])}, _dtype(ctx), params)
    return _checked(spec)


def _checked(spec: KernelSpec) -> KernelSpec:
    try:
        FAMILY.validate(spec)
    except ValueError as e:
        raise _Fail(f"that {spec.op} is not valid: {e}") from None
    return spec
