"""Pooling requests in words -> the pool family's spec (a phase and a builder of request.parse).

"max pool 3x3 stride 2 on a 16x64x112x112 fp16 tensor", "2x2 average pooling of 8x32x64x64,
then sigmoid", "adaptive avg pool to 7x7 on 32x512x14x14 bf16", "global average pooling over a
64x2048x7x7 tensor", "maxpool1d kernel 4 stride 2 dilation 2 on 16x32x4096 with indices",
"avg pool 3x3x3 padding 1 ceil mode, not counting padding, on 2x16x32x32x32".

`read_pool` runs beside the conv phase: when the request names a pooling it takes the pool's own
words (max / average, adaptive or global, 1d/2d/3d, the window, stride, padding, dilation, ceil
mode, whether padding counts, a divisor, indices, an adaptive output size) and adds the pool core
item; the input's shape and the pointwise steps after it are read by the usual phases.
`build_pool` turns it into the spec: the input is the one shape with N, C and the spatial sizes
(its length gives 1d/2d/3d when the words do not).  Stated defaults: window 2 per dim, stride =
window, padding 0, count padding (PyTorch's defaults).
"""
from __future__ import annotations

from mtmc.kernels.families.pool import FAMILY, pool_spec
from mtmc.request.build import _dtype, _values
from mtmc.request.conv_words import (
    _EQ, _N, _SIZES, _WORDS as _CONV_WORDS, _ints, _per_dim, _take_group, channels_agree, epilogue_after,
    read_length, spatial_input,
)
from mtmc.request.reading import _Ctx, _Fail, _Item, _rx

_KIND = r"(?:(?P<adaptive>adaptive|global)[\s_-]*)?(?P<kind>max|average|avg|mean)"
_POOL = rf"\b{_KIND}[\s_-]*pool(?:ing|s)?(?:[\s_-]*(?P<rank>[123])[\s_-]?d)?\b"
_WORDS = {  # key: patterns whose group v holds the value(s); taken in this order
    "output": [rf"\boutput[\s_-]*(?:size|shape)?{_EQ}(?P<v>{_SIZES})",
               rf"(?<=pool)(?:ing)?\s+(?:down\s+)?to\s+(?P<v>{_SIZES})"],
    "padding": [_CONV_WORDS["padding"][0], _CONV_WORDS["padding"][2]],   # "padding 1", "p1"
    "kernel": [rf"\b(?:kernel|window)(?:[\s_-]*size)?{_EQ}(?P<v>{_SIZES})", r"\bk\s*=\s*(?P<v>\d+)\b",
               rf"\b(?P<v>\d+(?:\s*[x*]\s*\d+)*)[\s-]+(?:kernel|window)s?\b",
               rf"\b(?P<v>\d{{1,2}}(?:\s*x\s*\d{{1,2}})*)[\s-]+(?=(?:adaptive|global)?[\s_-]*(?:max|average|avg|mean)"
               r"[\s_-]*pool)",
               # right after the pool word: "max pool 3x3 stride 2" (the pool word itself stays)
               r"pool(?:ing)?(?:[\s_-]*[123][\s_-]?d)?\s+(?P<v>\d{1,2}(?:\s*(?:x|by)\s*\d{1,2}){0,2})(?![\w.]|\s*x)"],
    "stride": _CONV_WORDS["stride"],
    "dilation": _CONV_WORDS["dilation"],
    "divisor": [rf"\bdivisor(?:[\s_-]*override)?{_EQ}(?P<v>{_N})", rf"\bdivided\s+by\s+(?P<v>{_N})"],
}
# PyTorch's keyword names with an explicit value, read before the bare words below
_NAMED_FLAGS = {"ceil_mode": r"ceil[\s_-]*mode", "count_include_pad": r"count[\s_-]*include[\s_-]*pad",
                "indices": r"return[\s_-]*indices"}
_FLAGS = {  # key: (pattern, value)
    "ceil_mode": (r"\bceil(?:ing)?[\s_-]*mode\b|\bround(?:ing)?\s+up\b", True),
    "count_include_pad": (r"\b(?:not\s+count(?:ing)?|exclud(?:e|ing))\s+(?:the\s+)?padd(?:ing|ed)(?:\s+values)?\b",
                          False),
    "indices": (r"\b(?:with|return(?:ing|s)?|and)\s+(?:the\s+|its\s+)?(?:argmax\s+)?indices\b"
                r"|\breturn[\s_-]*indices\b", True),
}


def read_pool(ctx: _Ctx) -> None:
    """Take a pool request's own words (nothing when it names no pooling)."""
    if not _rx(_POOL).search(ctx.s):
        return
    pool: dict = {}
    ctx.pool = pool
    read_length(ctx)
    for key, name in _NAMED_FLAGS.items():   # "ceil_mode=False" was read as ceil mode on
        for m in ctx.take(rf"\b{name}\s*(?:=|:|is|to)?\s*(?P<b>true|false|on|off|yes|no)\b"):
            pool[key] = m.group("b") in ("true", "on", "yes")
            ctx.note("pool", m.group(0).strip())
    for key, (pattern, value) in _FLAGS.items():
        for m in ctx.take(pattern):
            pool[key] = value
            ctx.note("pool", m.group(0).strip())
    for key, patterns in _WORDS.items():
        for pattern in patterns:
            after_pool = pattern.startswith("(?<=pool)") or pattern.startswith("pool")
            for m in (_take_group(ctx, pattern) if after_pool else ctx.take(pattern)):
                if key in pool:
                    raise _Fail(f"I found the pool's {key} twice; give it once.")
                value = _ints(ctx, m.group("v"))
                if isinstance(value, str):
                    raise _Fail(f"'{value}' padding is for convolutions; give a pool's padding as a number.")
                pool[key] = value[0] if key == "divisor" else value
                ctx.note("pool", m.group(0).strip())
    found = ctx.take(_POOL)
    if not found:   # its word sits in a call on tensors the formula phase reads
        raise _Fail("I cannot read that pooling call in full; say it in words, e.g. 'max pool 3x3 stride 2 "
                    "padding 1 on a 16x64x112x112 tensor'.")
    kinds = {("max" if m.group("kind") == "max" else "avg", bool(m.group("adaptive"))) for m in found}
    if len(kinds) > 1:
        raise _Fail("the request names two different poolings; I write one kernel per request.")
    (kind, adaptive), = kinds
    global_ = any(m.group("adaptive") == "global" for m in found)
    ranks = {int(m.group("rank")) for m in found if m.group("rank")}
    for m in ctx.take(r"\b([123])[\s_-]?d\b"):
        ranks.add(int(m.group(1)))
    if len(ranks) > 1:
        raise _Fail("the request names two different pooling dimensions (1d/2d/3d).")
    pool.update(kind=kind, adaptive=adaptive, global_=global_, rank=ranks.pop() if ranks else None)
    ctx.items.append(_Item(found[0].start(), found[0].end(), found[0].group(0).strip(), family="pool", op="pool"))
    ctx.note("ops", f"{found[0].group(0).strip()!r} -> {'adaptive ' if adaptive else ''}{kind} pool")


def build_pool(ctx: _Ctx, op: str) -> object:
    pool = getattr(ctx, "pool", {})
    _values(ctx, "pool")
    x, r = spatial_input(ctx, pool.get("rank"), "pool", "16x64x112x112", "give the window as 'kernel 3x3' or '3x3 max pool'")
    channels_agree(ctx, x, "pool")
    epilogue = epilogue_after(ctx, "pool")
    kind, adaptive = pool["kind"], pool["adaptive"] or pool.get("output") is not None
    op = f"{'adaptive_' if adaptive else ''}{kind}_pool{r}d"
    wrong = [k for k in ("kernel", "stride", "padding", "dilation", "ceil_mode", "divisor", "count_include_pad")
             if adaptive and k in pool]
    if wrong:
        raise _Fail(f"an adaptive pool takes an output size, not a {wrong[0].replace('_', ' ')}.")
    if kind == "avg" and "dilation" in pool:
        raise _Fail("average pooling has no dilation (PyTorch's neither).")
    if kind == "avg" and pool.get("indices"):
        raise _Fail("only max pooling returns indices.")
    try:
        if adaptive:
            size = pool.get("output")
            if size is None:
                size = [1] * r
                if not pool["global_"]:
                    ctx.assume("no output size given: 1 per dim (global pooling)")
            spec = pool_spec(op, x, output_size=_per_dim(size, r, "output size", None), indices=pool.get("indices", False),
                             epilogue=epilogue, dtype=_dtype(ctx))
        else:
            kernel = _per_dim(pool.get("kernel"), r, "window", None)
            if kernel is None:
                kernel = [2] * r
                ctx.assume(f"no window given: {'x'.join(map(str, kernel))}, stride the same")
            kw = {"stride": _per_dim(pool.get("stride"), r, "stride", None),
                  "padding": _per_dim(pool.get("padding"), r, "padding", 0), "ceil_mode": pool.get("ceil_mode", False)}
            if kind == "max":
                kw.update(dilation=_per_dim(pool.get("dilation"), r, "dilation", 1), indices=pool.get("indices", False))
            else:
                kw.update(count_include_pad=pool.get("count_include_pad", True), divisor_override=pool.get("divisor"))
            spec = pool_spec(op, x, kernel=kernel, epilogue=epilogue, dtype=_dtype(ctx), **kw)
        FAMILY.validate(spec)
    except ValueError as e:
        raise _Fail(f"that pooling is not valid: {e}") from None
    return spec
