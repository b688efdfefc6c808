"""Attention requests in words -> the attention family's spec (a phase and a builder of parse).

"causal flash attention, batch 8, 16 heads, sequence length 2048, head dim 64, fp16",
"scaled dot product attention on q, k, v of shape 32x32x512x64 in bf16",
"multi-head self-attention with 12 heads over 4x1024x768 fp16 activations, causal",
"sdpa with an additive mask, q 8x16x1024x128 and k/v 8x16x4096x128, scale 0.1".

`read_attention` runs right after the dtype phase: when the request names attention it takes
the attention's own words (causal, the mask kind, scale, dropout, heads, head dim, model dim,
key length, value dim) and adds the core item; the sizes ("batch 8", "sequence length 2048")
and shapes are read by the usual phases.  `build_attention` makes the spec: a 4-D shape is
[B, H, L, E], a 3-D one [B, L, model dim] split into the heads; a second shape gives k/v (S,
and the value dim).  Stated defaults: no mask, scale 1/sqrt(head dim), S = L, value dim = E.
"""
from __future__ import annotations

from mtmc.kernels.families.attention import FAMILY, attention_spec
from mtmc.request.build import _dtype, _use, _values, _x
from mtmc.request.reading import NUM, _Ctx, _Fail, _Item, _number, _rx

_ATTENTION = (r"\b(?:flash[\s_-]*)?attention\b|\bsdpa\b|\bscaled[\s_-]+dot[\s_-]*product(?:[\s_-]+attention)?\b"
              r"|\bmulti[\s_-]*head(?:ed)?(?:[\s_-]+self)?(?:[\s_-]+attention)?\b|\bself[\s_-]*attention\b|\bmha\b")
_N = r"\d+k?(?![\w.])"
_EQ = r"\s*(?:=|:|of|is)?\s*"
_SIZES = {  # key: patterns whose group v is the size
    "heads": [rf"\b(?P<v>{_N})[\s_-]+(?:attention[\s_-]+)?heads\b", rf"\b(?:num[\s_-]*)?heads{_EQ}(?P<v>{_N})"],
    "head_dim": [rf"\bhead[\s_-]*(?:dim(?:ension)?|size){_EQ}(?P<v>{_N})", rf"\b(?P<v>{_N})[\s_-]+head[\s_-]*dim\b",
                 rf"\bd[\s_-]*(?:k|head){_EQ}(?P<v>{_N})"],
    "model_dim": [rf"\b(?:model|embed(?:ding)?|hidden)[\s_-]*(?:dim(?:ension)?|size|width){_EQ}(?P<v>{_N})",
                  rf"\bd[\s_-]*model{_EQ}(?P<v>{_N})", rf"\bn[\s_-]*embd{_EQ}(?P<v>{_N})"],
    "kv_len": [rf"\b(?:kv|key(?:[\s_-]*value)?|keys?)[\s_-]*(?:seq(?:uence)?[\s_-]*)?len(?:gth)?{_EQ}(?P<v>{_N})",
               rf"\b(?P<v>{_N})[\s_-]+keys\b"],
    "value_dim": [rf"\bvalue[\s_-]*(?:head[\s_-]*)?(?:dim(?:ension)?|size){_EQ}(?P<v>{_N})"],
}
_HEADS_OF_DIM = (rf"\b(?P<h>{_N})[\s_-]+(?:attention[\s_-]+)?heads\s+(?:of|with)\s+(?:head[\s_-]*)?"
                 rf"(?:dim(?:ension)?|size)\s*(?:=|:|of)?\s*(?P<d>{_N})")
_MASKS = [  # (pattern, mask kind), specific first
    (r"\b(?:add(?:itive)?|float|bias)[\s_-]+(?:attention[\s_-]+)?mask\b|\battention[\s_-]+bias\b", "add"),
    (r"\b(?:bool(?:ean)?|padding|key[\s_-]*padding)[\s_-]+(?:attention[\s_-]+)?mask\b", "keep"),
    (r"\bcausal(?:ly)?(?:[\s_-]+(?:mask(?:ed|ing)?|self))?\b|\bmasked\b|\b(?:lower[\s_-]*)?triangular[\s_-]+mask\b"
     r"|\bautoregressive\b", "causal"),
]


# a causal mask said not to be there: no mask (unless another mask is named)
_NOT_CAUSAL = (r"\b(?:non|not|un)[\s_-]*causal(?:ly)?(?:[\s_-]+mask(?:ed|ing)?)?\b"
               r"|\b(?:no|without(?:\s+an?|\s+the)?)\s+causal(?:[\s_-]+(?:mask(?:ing)?|masked))?\b"
               r"|\b(?:is_)?causal\s*=\s*false\b")


def read_attention(ctx: _Ctx) -> None:
    """Take an attention request's own words (nothing when it names no attention)."""
    # "softmax over an attention score tensor": the word names the tensor, not the op
    for m in ctx.take(r"\battention(?=[\s_-]+(?:scores?|weights|logits|probs|probabilit\w+|maps?|matri\w+)\b)"):
        ctx.note("tensor", m.group(0))
    if not _rx(_ATTENTION).search(ctx.s):
        return
    att: dict = {"mask": None}
    ctx.attention = att
    if ctx.take(rf"\bdropout(?:[\s_-]*(?:p|prob\w*|rate))?{_EQ}{NUM}|\b{NUM}\s+dropout\b"):
        raise _Fail("attention dropout is random; the kernel computes dropout 0 only (inference).")
    for m in ctx.take(rf"\b(?:softmax[\s_-]+)?scal(?:e|ing)(?:[\s_-]*factor)?{_EQ}(?P<v>{NUM})"):
        att["scale"] = _number(m.group("v"))
        ctx.note("attention", m.group(0).strip())
    for m in ctx.take(_HEADS_OF_DIM):   # "12 heads of dim 64": both sizes in one phrase
        att["heads"], att["head_dim"] = ctx.to_int(m.group("h")), ctx.to_int(m.group("d"))
        ctx.note("attention", m.group(0).strip())
    for key, patterns in _SIZES.items():
        for pattern in patterns:
            for m in ctx.take(pattern):
                value = ctx.to_int(m.group("v"))
                if att.get(key) not in (None, value):
                    raise _Fail(f"I found two different {key.replace('_', ' ')}s: {att[key]} and {value}.")
                att[key] = value
                ctx.note("attention", m.group(0).strip())
    for m in ctx.take(_NOT_CAUSAL):   # before the masks: "non-causal" once read as "causal"
        ctx.note("attention", m.group(0).strip())
    for pattern, kind in _MASKS:
        for m in ctx.take(pattern):
            if att["mask"] not in (None, kind):
                raise _Fail(f"the request names two masks ({att['mask']} and {kind}); attention takes one.")
            att["mask"] = kind
            ctx.note("attention", m.group(0).strip())
    found = ctx.take(_ATTENTION)
    if not found:   # its word sits in a call on tensors the formula phase reads (one with a tensor mask)
        raise _Fail("I cannot read that attention call in full; say it in words, e.g. 'causal attention, batch 8, "
                    "16 heads, sequence length 2048, head dim 64', and a mask as 'with a boolean mask' or 'with "
                    "an additive mask'.")
    ctx.take(r"\bq\s*,\s*k\s*(?:,|and)\s*v\b|\bquer(?:y|ies)\s*,\s*keys?\s*(?:,|and)\s*values?\b|\bk\s*/\s*v\b")
    ctx.items.append(_Item(found[0].start(), found[0].end(), found[0].group(0).strip(), family="attention", op="sdpa"))
    ctx.note("ops", f"{found[0].group(0).strip()!r} -> attention")


def _from_words(ctx: _Ctx, att: dict) -> list[int]:
    """[B, H, L, E] from batch, heads, sequence length, head dim (or model dim / heads)."""
    if "seq" not in ctx.sizes and "rows" in ctx.sizes and "batch" in ctx.sizes:   # "over 2048 tokens, batch 4"
        ctx.size("seq", ctx.sizes.pop("rows"))
        ctx.assume(f"{ctx.sizes['seq']} tokens read as the sequence length of each batch item")
    missing = [w for k, w in (("batch", "the batch"), ("seq", "the sequence length")) if k not in ctx.sizes]
    if att.get("heads") is None:
        missing.append("the number of heads")
    if att.get("head_dim") is None and att.get("model_dim") is None:
        missing.append("the head dim")
    if missing:
        raise _Fail(f"attention needs {', '.join(missing)}: give q's shape as B x H x L x E (e.g. 8x16x2048x64), "
                    "or batch, heads, sequence length and head dim in words.")
    _use(ctx, "batch", "seq")
    return [ctx.sizes["batch"], att["heads"], ctx.sizes["seq"], _head_dim(att, att["heads"])]


def _head_dim(att: dict, heads: int) -> int:
    if att.get("model_dim") is not None:
        if att["model_dim"] % heads:
            raise _Fail(f"the model dim {att['model_dim']} does not split into {heads} heads.")
        e = att["model_dim"] // heads
        if att.get("head_dim") not in (None, e):
            raise _Fail(f"the model dim {att['model_dim']} over {heads} heads is {e}, not head dim {att['head_dim']}.")
        return e
    return att["head_dim"]


def _query(ctx: _Ctx, att: dict, shape: list[int]) -> list[int]:
    """q as [B, H, L, E] from a 4-D shape, or a 3-D [B, L, model dim] with the heads in words."""
    if len(shape) == 4:
        return shape
    if len(shape) == 3:
        heads = att.get("heads")
        if heads is None:
            ctx.assume(f"a 3-D shape {_x(shape)} is [B, L, E] with one head")
            return [shape[0], 1, shape[1], shape[2]]
        att.setdefault("model_dim", shape[2])
        if att["model_dim"] != shape[2]:
            raise _Fail(f"the shape {_x(shape)} has model dim {shape[2]}, but the request says {att['model_dim']}.")
        return [shape[0], heads, shape[1], _head_dim(att, heads)]
    raise _Fail(f"attention takes q as B x H x L x E (or B x L x model dim with heads); got {_x(shape)}.")


def build_attention(ctx: _Ctx, op: str) -> object:
    att = getattr(ctx, "attention", {"mask": None})
    _values(ctx, "attention")
    if any(not it.is_core for it in ctx.items):
        step = next(it.words for it in ctx.items if not it.is_core)
        raise _Fail(f"'{step}' with attention: the attention kernel fuses no pointwise ops yet; ask for it apart.")
    shapes = list(ctx.shapes)
    if len(shapes) > 3:
        raise _Fail(f"I found {len(shapes)} shapes; attention takes q, k and v.")
    qs = _query(ctx, att, shapes[0]) if shapes else _from_words(ctx, att)
    for key, name in (("batch", "batch"), ("seq", "sequence length")):
        if key in ctx.sizes:
            at = 0 if key == "batch" else 2
            if ctx.sizes[key] != qs[at]:
                raise _Fail(f"q {_x(qs)} has {name} {qs[at]}, but the request says {ctx.sizes[key]}.")
            _use(ctx, key)
    if att.get("heads") not in (None, qs[1]):
        raise _Fail(f"q {_x(qs)} has {qs[1]} heads, but the request says {att['heads']}.")
    b, h, length, e = qs
    s, ev = att.get("kv_len", length), att.get("value_dim", e)
    if len(shapes) >= 2:   # k (and v) shapes: S, and v's head dim
        k = _query(ctx, dict(att), shapes[1])
        v = _query(ctx, {**att, "model_dim": None}, shapes[2]) if len(shapes) == 3 else k
        if k[:2] != [b, h] or v[:3] != k[:3] or k[3] != e:
            raise _Fail(f"k/v shapes {', '.join(map(_x, shapes[1:]))} do not match q {_x(qs)} "
                        "(same batch and heads, k's head dim = q's).")
        s, ev = k[2], v[3]
    mask = att["mask"] or "none"
    if mask == "none":
        ctx.assume("no mask")
    if att.get("scale") is None:
        ctx.assume(f"scale 1/sqrt({e})")
    try:
        spec = attention_spec([b, h, length, e], [b, h, s, e], [b, h, s, ev], dtype=_dtype(ctx), mask=mask,
                              scale=att.get("scale"))
        FAMILY.validate(spec)
    except ValueError as err:
        raise _Fail(f"that attention is not valid: {err}") from None
    return spec
