"""Convolution requests in words -> the conv family's spec (a phase and a builder of kernels.parse).

"conv2d 3x3 stride 2 padding 1 on 16x64x56x56 float16 with 128 output channels",
"depthwise conv 5x5 on a 8x96x112x112 bf16 input", "a 3x3 conv with 64 in and 128 out channels,
stride 2, on a 32x64x56x56 bf16 input, then relu", "transposed conv1d kernel 4 stride 2 padding 1
on 8x32x1024 with 16 output channels".

`read_conv` runs right after the dtype phase: when the request names a convolution it takes the
conv's own words (the op word, 1d/2d/3d, transposed, depthwise, pointwise, kernel, stride,
padding, output padding, dilation, groups, channel counts) and adds the conv core item; the
input's shape and the pointwise steps after the conv are read by the usual phases.  `build_conv`
turns it all into the spec: the input is the one shape with N, C and the spatial sizes (its
length gives 1d/2d/3d when the words do not), the steps after the conv are its epilogue ("with
bias" is the conv's bias).  Stated defaults: kernel 3 (1 for pointwise), stride 1, padding 0,
dilation 1, as many output channels as input channels.
"""
from __future__ import annotations

import re

from mtmc.kernels.families.conv import FAMILY, SPATIAL, conv_spec
from mtmc.request.build import _dtype, _ordered, _steps, _use, _values, _x
from mtmc.request.padmode_words import read_padding_mode
from mtmc.request.reading import _Ctx, _Fail, _Item, _rx

_CONV = r"\b(?:conv(?:olution(?:al)?)?s?|deconv(?:olution)?s?)(?:[\s_-]*(?:[123][\s_-]?d))?\b|\bconv_?transpose[123]d\b"
# sizes: 3, 3x3, (3, 5), [1, 2]; a plain number may not run into a name or a decimal
_SIZES = (r"\d+(?:\s*[x*]\s*\d+)*(?![\w.])|\(\s*\d+(?:\s*,\s*\d+)*\s*,?\s*\)"
          r"|\[\s*\d+(?:\s*,\s*\d+)*\s*\]")
_N = r"\d+(?![\w.])"
_KIND = r"(?:depth[\s_-]*wise|point[\s_-]*wise|grouped|transposed?|dilated|strided|[123][\s_-]?d)"
_EQ = r"\s*(?:=|:|of|is)?\s*"
_WORDS = {  # key: patterns whose group v holds the value(s); taken in this order
    "output_padding": [rf"\boutput[\s_-]*padding{_EQ}(?P<v>{_SIZES})"],
    "padding": [rf"\b(?:zero[\s_-]*)?pad(?:ding|ded)?(?:\s+by)?{_EQ}(?P<v>same|valid|{_SIZES})",
                r"\b(?P<v>same|valid)[\s_-]+padding\b", r"\bp\s*=?\s*(?P<v>\d+)\b"],
    "kernel": [rf"\bkernel(?:[\s_-]*size)?{_EQ}(?P<v>{_SIZES})", r"\bk\s*=\s*(?P<v>\d+)\b",
               rf"\b(?P<v>\d+(?:\s*[x*]\s*\d+)+)[\s-]+(?:kernel|filter|window)s?\b", rf"\b(?P<v>{_N})[\s-]+kernel\b",
               rf"\b(?P<v>\d{{1,2}}(?:\s*x\s*\d{{1,2}})*)[\s-]+(?=(?:{_KIND}[\s_-]+)*(?:conv|deconv))",
               # right after the conv word: "conv2d 3x3 stride 2" (the conv word itself stays), but not
               # a channel count there: "conv2d 3 input channels 64 output channels kernel 7"
               rf"(?:\bconv|\bdeconv)\w*\s+(?P<v>\d{{1,2}}(?:\s*x\s*\d{{1,2}}){{0,2}})(?![\w.]|\s*x)"
               rf"(?!\s+(?:in(?:put)?|out(?:put)?|channels|filters|feature|groups|to)\b)"],
    # "conv2d 3x3 s2 p1": s / p / d shorthands (a conv's or pool's own words only)
    "stride": [rf"\bstrides?(?:\s+by)?{_EQ}(?P<v>{_SIZES})", rf"\bstrided\s+by\s+(?P<v>{_SIZES})",
               r"\bs\s*=?\s*(?P<v>\d+)\b"],
    "dilation": [rf"\bdilat(?:ion|ed)(?:\s+by)?{_EQ}(?P<v>{_SIZES})", r"\bd\s*=?\s*(?P<v>[1-9]\d?)\b(?![\s_-]*(?:conv|pool))"],
    "groups": [rf"\bgroups?{_EQ}(?P<v>{_N})", rf"\b(?P<v>{_N})\s+groups\b"],
}
_CHANNELS = [  # (pattern, which channel counts its groups give)
    (rf"\b(?P<a>{_N})\s+in(?:put)?\s+and\s+(?P<b>{_N})\s+out(?:put)?\s+channels\b", ("in", "out")),
    # "projecting 256 channels to 64", "64 in 64 out", "conv2d(in=32, out=64, ...)"
    (rf"\b(?P<a>{_N})\s+channels\s+(?:in)?to\s+(?P<b>{_N})(?:\s+channels)?\b", ("in", "out")),
    (rf"\b(?P<a>{_N})\s+in\s*,?\s*(?P<b>{_N})\s+out\b", ("in", "out")),
    (rf"\bin(?:_channels)?\s*=\s*(?P<a>{_N})", ("in",)),
    (rf"\bout(?:_channels)?\s*=\s*(?P<a>{_N})", ("out",)),
    (rf"\b(?:from\s+)?(?P<a>{_N})\s+to\s+(?P<b>{_N})\s+channels\b|\b(?P<a2>{_N})\s*->\s*(?P<b2>{_N})\s+channels\b",
     ("in", "out")),
    (rf"\b(?:in(?:put)?[\s_-]*channels|c[\s_-]*in){_EQ}(?P<a>{_N})|\b(?P<a2>{_N})\s+in(?:put)?[\s_-]*channels\b",
     ("in",)),
    (rf"\b(?:out(?:put)?[\s_-]*channels|c[\s_-]*out|filters){_EQ}(?P<a>{_N})"
     rf"|\b(?P<a2>{_N})\s+(?:out(?:put)?[\s_-]*channels|filters|feature[\s_-]*maps)\b"
     rf"|\bto\s+(?P<a3>{_N})\s+channels\b", ("out",)),
]


def _take_group(ctx: _Ctx, pattern: str) -> list[re.Match]:
    """Like ctx.take, but only group v of each match becomes used (the words around it stay)."""
    found = list(_rx(pattern).finditer(ctx.s))
    for m in found:
        a, b = m.span("v")
        ctx.s = ctx.s[:a] + " " * (b - a) + ctx.s[b:]
    return found


def _ints(ctx: _Ctx, text: str) -> list[int] | str:
    text = text.strip()
    if text in ("same", "valid"):
        return text
    return [ctx.to_int(t) if t.strip() != "0" else 0 for t in re.split(r"[^\dk]+", text) if t.strip()]


def read_conv(ctx: _Ctx) -> None:
    """Take a conv request's own words (nothing when it names no convolution)."""
    if not _rx(_CONV).search(ctx.s):
        return
    if _rx(r"\bseparable\b").search(ctx.s):
        raise _Fail("a depthwise separable convolution is two convolutions (a depthwise one, then a pointwise "
                    "1x1 one); I write one kernel per request: ask for them one at a time, or upload the module.")
    conv: dict = {"rank": None, "transposed": False, "depthwise": False, "pointwise": False}
    ctx.conv = conv
    read_length(ctx)
    read_padding_mode(ctx, conv)
    for key, patterns in _WORDS.items():
        for pattern in patterns:
            after_conv = pattern.startswith("(?:\\bconv|")   # keep the conv word itself
            for m in (_take_group(ctx, pattern) if after_conv else ctx.take(pattern)):
                if key in conv:
                    raise _Fail(f"I found the conv's {key.replace('_', ' ')} twice; give it once.")
                value = _ints(ctx, m.group("v"))
                conv[key] = value[0] if key == "groups" else value
                ctx.note("conv", m.group(0).strip())
    for pattern, keys in _CHANNELS:
        for m in ctx.take(pattern):
            values = [v for v in m.groups() if v is not None]
            for key, v in zip(keys, values):
                if conv.get(key) not in (None, ctx.to_int(v)):
                    raise _Fail(f"I found two different {key}put channel counts: {conv[key]} and {v}.")
                conv[key] = ctx.to_int(v)
            ctx.note("conv", m.group(0).strip())
    transposed = ctx.take(r"\b(?:transpos\w*|de[\s_-]?conv\w*|up[\s_-]?conv\w*|fractionally[\s_-]+strided)")
    for m in transposed:
        conv["transposed"] = True
        ctx.note("conv", m.group(0).strip())
    for m in ctx.take(r"\bdepth[\s_-]*wise\b"):
        conv["depthwise"] = True
        ctx.note("conv", m.group(0).strip())
    for m in ctx.take(r"\bpoint[\s_-]*wise(?=[\s_-]+conv)"):
        conv["pointwise"] = True
        ctx.note("conv", m.group(0).strip())
    for m in ctx.take(r"\b([123])[\s_-]?d\b"):
        if conv["rank"] not in (None, int(m.group(1))):
            raise _Fail("the request names two different conv dimensions (1d/2d/3d).")
        conv["rank"] = int(m.group(1))
    found = ctx.take(_CONV) or transposed   # "deconv" alone was taken as the transposed word
    if not found:   # its word sits in a call on tensors ("F.conv2d(x, w, ...)"): was an IndexError
        raise _Fail("I cannot read a convolution call on tensors; say it in words, e.g. 'conv2d 3x3 stride 2 "
                    "padding 1 on 8x3x32x32 with 16 output channels', or as nn.Conv2d(3, 16, 3, stride=2, padding=1).")
    for m in found:
        digits = re.findall(r"[123](?=[\s_-]?d)", m.group(0))
        if digits:
            if conv["rank"] not in (None, int(digits[0])):
                raise _Fail("the request names two different conv dimensions (1d/2d/3d).")
            conv["rank"] = int(digits[0])
        if "transpose" in m.group(0) or m.group(0).startswith("deconv"):
            conv["transposed"] = True
    ctx.items.append(_Item(found[0].start(), found[0].end(), found[0].group(0).strip(), family="conv", op="conv"))
    ctx.note("ops", f"{found[0].group(0).strip()!r} -> conv")


def _per_dim(value, r: int, what: str, default):
    if value is None:
        return default
    if isinstance(value, str):
        return value
    if len(value) == 1:
        return value * r
    if len(value) != r:
        raise _Fail(f"the {what} {_x(value)} has {len(value)} sizes; a {r}d conv takes 1 or {r}.")
    return value


_LENGTH = rf"\b(?:input[\s_-]+|sequence[\s_-]+|signal[\s_-]+|spatial[\s_-]+)?length{_EQ}(?P<v>{_N})"


def read_length(ctx: _Ctx) -> None:
    """A 1d input's length said in words ("length 1024"), kept for spatial_input; read by the conv
    and pool phases only, so "a vector of length N" stays a shape elsewhere."""
    for m in ctx.take(_LENGTH):
        if getattr(ctx, "spatial_length", None) not in (None, ctx.to_int(m.group("v"))):
            raise _Fail("I found two different input lengths; give it once.")
        ctx.spatial_length = ctx.to_int(m.group("v"))
        ctx.note("context", m.group(0).strip())


def spatial_input(ctx: _Ctx, r: int | None, what: str, example: str, hint: str,
                  channels: int | None = None) -> tuple[list[int], int]:
    """The one N x C x spatial input shape of a conv or pool request, and its rank (from the shape's
    length when the words gave none); `what` names the op in messages ("conv", "pool").  The shape
    may also come in words: the batch, the channels (`channels`, or "C channels") and the spatial
    sizes ("length 1024", or a shape of the rank's length)."""
    shapes = sorted(ctx.shapes, key=len, reverse=True)
    length = getattr(ctx, "spatial_length", None)
    if length is not None:
        if r not in (None, 1) or (shapes and shapes != [[length]]):
            raise _Fail(f"I found a length ({length}) beside the input's shape; give one of them.")
        shapes, r = [[length]], 1
    if not shapes:
        raise _Fail(f"a {what} needs its input's shape: give it as N x C x H x W (e.g. {example}; "
                    "N x C x L for 1d, N x C x D x H x W for 3d).")
    x = shapes[0]
    channels = channels if channels is not None else ctx.sizes.get("channels")
    if "batch" in ctx.sizes and r is not None and len(x) == r + 1:
        x = [ctx.sizes["batch"], *x]
        _use(ctx, "batch")
    elif "batch" in ctx.sizes and channels is not None and r is not None and len(x) == r:   # sizes in words
        x = [ctx.sizes["batch"], channels, *x]
        _use(ctx, "batch")
    elif "batch" in ctx.sizes and channels is not None and r is None and len(x) <= 3:
        # "batch 32, 64 channels, 56x56 images": the shape is C x spatial when it starts with C, else spatial
        x = [ctx.sizes["batch"], *x] if x[0] == channels and len(x) > 1 else [ctx.sizes["batch"], channels, *x]
        _use(ctx, "batch")
    if r is None:
        r = len(x) - 2
    if r not in SPATIAL or len(x) != r + 2:
        raise _Fail(f"the {what}'s input {_x(x)} is not N x C x {' x '.join(SPATIAL.get(r, ('H', 'W')))}: give the "
                    f"batch, the channels and the spatial sizes (e.g. {example} for a 2d {what}).")
    if len(shapes) > 1:
        raise _Fail(f"I found several shapes ({', '.join(map(_x, ctx.shapes))}); a {what} takes one input shape "
                    f"({hint}).")
    return x, r


def channels_agree(ctx: _Ctx, x: list[int], what: str) -> None:
    """'C channels' said beside an N x C x ... input must be its C (a pool's, a channel norm's)."""
    said = ctx.sizes.get("channels")
    if said is not None and said != x[1]:
        raise _Fail(f"the input {_x(x)} has {x[1]} channels, but the request says {said}.")
    _use(ctx, "channels")


def epilogue_after(ctx: _Ctx, what: str) -> list[dict]:
    """The pointwise steps after the core op (a conv's or pool's epilogue); steps before it fail."""
    order = _ordered(ctx)
    core_at = next(i for i, it in enumerate(order) if it.is_core)
    before = [it.words for it in order[:core_at] if not it.is_core]
    if before:
        raise _Fail(f"'{before[0]}' comes before the {what}; its kernel fuses ops after it (its epilogue) only.")
    return _steps([it for it in order[core_at + 1:] if not it.is_core])


BARE_KERNEL_MAX = 15   # "..., 3x3, on 8x64x32x32": a small shape of the input's spatial rank is the kernel


def _bare_kernel(ctx: _Ctx, conv: dict) -> None:
    """A second, small shape with one size per spatial dim of the one input shape, and no kernel
    said otherwise: the kernel ("grouped conv2d, 64 to 128 channels, 3x3, on 8x64x32x32")."""
    if conv.get("kernel") is not None or len(ctx.shapes) != 2:
        return
    x, k = sorted(ctx.shapes, key=len, reverse=True)
    if len(k) == len(x) - 2 and max(k) <= BARE_KERNEL_MAX:
        ctx.shapes.remove(k)
        conv["kernel"] = k
        ctx.assume(f"{_x(k)} read as the kernel size")


def build_conv(ctx: _Ctx, op: str) -> object:
    conv = getattr(ctx, "conv", {})
    _values(ctx, "conv")
    _bare_kernel(ctx, conv)
    x, r = spatial_input(ctx, conv.get("rank"), "conv", "16x64x56x56", "give the kernel as 'kernel 3x3' or '3x3 conv'",
                         channels=conv.get("in"))
    c_in = x[1]
    if conv.get("in") not in (None, c_in):
        raise _Fail(f"the input {_x(x)} has {c_in} channels, but the request says {conv['in']} input channels.")
    said = ctx.sizes.get("channels")   # "a depthwise conv with 32 channels": C, or else the output's
    _use(ctx, "channels")
    if said is not None and said != c_in:
        if conv["depthwise"] or conv.get("out") not in (None, said):
            raise _Fail(f"the input {_x(x)} has {c_in} channels, but the request says {said} channels.")
        conv["out"] = said
        ctx.assume(f"'{said} channels' read as the output channels (the input has {c_in})")
    if conv["depthwise"]:
        if conv.get("groups") not in (None, c_in):
            raise _Fail(f"a depthwise conv has one group per channel ({c_in}), not {conv['groups']}.")
        conv["groups"] = c_in
    c_out = conv.get("out")
    if c_out is None:
        c_out = c_in
        ctx.assume(f"no output channel count given: {c_out}, as many as the input has")
    kernel = _per_dim(conv.get("kernel"), r, "kernel", None)
    if kernel is None:
        kernel = [1] * r if conv["pointwise"] else [3] * r
        if not conv["pointwise"]:
            ctx.assume(f"no kernel size given: {'x'.join(map(str, kernel))}")
    epilogue = epilogue_after(ctx, "conv")
    op = ("conv_transpose" if conv["transposed"] else "conv") + f"{r}d"
    params = {"stride": _per_dim(conv.get("stride"), r, "stride", 1),
              "padding": _per_dim(conv.get("padding"), r, "padding", 0),
              "dilation": _per_dim(conv.get("dilation"), r, "dilation", 1)}
    if params["padding"] == "valid":
        params["padding"] = 0
    if params["padding"] == "same":
        strides = params["stride"] if isinstance(params["stride"], list) else [params["stride"]]
        if conv["transposed"] or any(s != 1 for s in strides):
            raise _Fail("'same' padding is for plain convs with stride 1.")
        dil = params["dilation"] if isinstance(params["dilation"], list) else [params["dilation"]] * r
        params["padding"] = [[d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2] for k, d in zip(kernel, dil)]
    if conv["transposed"]:
        params["output_padding"] = _per_dim(conv.get("output_padding"), r, "output padding", 0)
    elif conv.get("output_padding") is not None:
        raise _Fail("output padding is for transposed convs only.")
    try:
        if conv.get("padding_mode", "zeros") != "zeros":
            params["padding_mode"] = conv["padding_mode"]
        spec = conv_spec(op, x, c_out, kernel, groups=conv.get("groups", 1), epilogue=epilogue, dtype=_dtype(ctx),
                         **params)
        FAMILY.validate(spec)
    except ValueError as e:
        raise _Fail(f"that convolution is not valid: {e}") from None
    return spec
