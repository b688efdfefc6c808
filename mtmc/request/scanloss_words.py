"""Scan and loss requests in words -> the scan or loss family's spec (a phase and a builder of
request.parse, as request.conv_words is for convolutions).

"cumsum along the rows of a 128x32768 fp32 tensor", "reverse cumulative sum of a 32768x32768
tensor", "exclusive prefix sum over the last dim of a 4096x8192 bf16 tensor", "masked cumsum of a
32768x32768 tensor", "cumprod of a 1024x4096 tensor"; "cross entropy loss of 32768x4096 logits",
"triplet margin loss with margin 0.5 on 32768x8192 embeddings", "mse loss of two 32768x32768
tensors", "huber loss delta 0.5, sum reduction, 8192x8192 fp16", "kl divergence with batchmean
reduction of 32768x4096 probabilities", "cosine similarity loss of 32768x8192", "hinge loss of
32768x32768", "cosine similarity of 4096x1024 rows" (one value per row).

`read_scanloss` runs right after the conv phase: when the request names a scan or a loss it takes
the op's own words (the op, reverse / exclusive / masked, the reduction, margin, delta, beta, p,
ignore index, label smoothing) and adds the core item; the shape and dtype are read by the usual phases.
`build_scanloss` turns it into the spec: scans run along the last dim of the shape (leading dims
are rows), losses read [rows, width] tensors.  Stated defaults: reduction mean, PyTorch's margins.
"""
from __future__ import annotations

from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.request.build import _check_axis, _dtype, _row_dims, _values
from mtmc.request.reading import NUM, _Ctx, _Fail, _Item, _number

_SCANS = [  # (pattern, op), longest phrases first
    (r"\b(?:cum(?:ulative)?[\s_-]*prod(?:uct)?|running[\s_-]+product|prefix[\s_-]+product)s?\b", "cumprod"),
    (r"\b(?:cum(?:ulative)?[\s_-]*sum|running[\s_-]+(?:sum|total)|prefix[\s_-]+sum|inclusive[\s_-]+scan|scan)s?\b",
     "cumsum"),
]
_LOSSES = [  # (pattern, op, extra params)
    (r"\bcross[\s_-]*entropy(?:[\s_-]+loss)?\b|\bnll\s+of\s+log[\s_-]*softmax\b", "cross_entropy", {}),
    (r"\btriplet(?:[\s_-]+margin)?(?:[\s_-]+loss)?\b", "triplet_margin", {}),
    (r"\bcosine[\s_-]+embedding(?:[\s_-]+loss)?\b", "cosine_embedding", {}),
    (r"\bcosine[\s_-]+(?:similarity|distance)[\s_-]+loss\b|\b1\s*-\s*cosine[\s_-]+similarity\b",
     "cosine_similarity", {"epilogue": [{"op": "neg"}, {"op": "shift", "value": 1.0}]}),
    (r"\bcosine[\s_-]+similarity\b", "cosine_similarity", {"reduction": "none"}),
    (r"\bhinge[\s_-]+embedding(?:[\s_-]+loss)?\b", "hinge_embedding", {}),
    (r"\bhinge(?:[\s_-]+loss)?\b", "total", {"prologue": [{"op": "mul"}, {"op": "neg"}, {"op": "shift", "value": 1.0},
                                                       {"op": "clamp_min", "value": 0.0}]}),
    (r"\bsmooth[\s_-]*l1(?:[\s_-]+loss)?\b", "smooth_l1", {}),
    (r"\bhuber(?:[\s_-]+loss)?\b", "huber", {}),
    (r"\bkl[\s_-]*div(?:ergence)?(?:[\s_-]+loss)?\b|\bkullback[\s_-]+leibler(?:[\s_-]+divergence)?\b", "kl_div", {}),
    (r"\b(?:mse|mean[\s_-]+squared?[\s_-]+error)(?:[\s_-]+loss)?\b|\bl2[\s_-]+loss\b", "mse", {}),
    (r"\b(?:l1|mae|mean[\s_-]+absolute[\s_-]+error)(?:[\s_-]+loss)?\b", "l1", {}),
]
_REDUCTION = [
    (r"\b(?:reduction\s*(?:=|:|of|is)?\s*['\"]?(?P<r>mean|sum|none|batchmean)['\"]?"
     r"|(?P<r3>sum|mean|no|batchmean)\s+reduction|(?P<r2>batchmean|summed)"
     r"|without\s+reduction|per[\s_-]+(?:row|element|sample))\b"),
]
_SETTINGS = {key: rf"\b{word}\s*(?:=|:|of|is)?\s*(?P<v>{NUM})" for key, word in [
    ("margin", "margin"), ("delta", "delta"), ("beta", "beta"), ("p", r"(?:p|norm(?:\s+degree)?)"),
    ("ignore_index", r"ignore[\s_-]*index"), ("label_smoothing", r"label[\s_-]*smoothing(?:\s+of)?")]}
_MODIFIERS = {"reverse": r"\brevers(?:e|ed)\b|\bbackwards?\b|\bsuffix\b|\bfrom\s+the\s+(?:end|right)\b",
              "exclusive": r"\bexclusive\b", "masked": r"\bmasked\b|\bwith\s+a\s+(?:bool(?:ean)?\s+)?mask\b",
              "log_target": r"\blog[\s_-]*target\b"}


def read_scanloss(ctx: _Ctx) -> None:
    """Take a scan's or a loss's own words (nothing when the request names neither)."""
    for family, table in (("loss", _LOSSES), ("scan", _SCANS)):
        for row in table:
            found = ctx.take(row[0])
            if found:
                ctx.items.append(_Item(found[0].start(), found[0].end(), found[0].group(0).strip(), family=family,
                                       op=row[1]))
                ctx.note("ops", f"{found[0].group(0).strip()!r} -> {row[1]}")
                ctx.scanloss = {"family": family, "op": row[1], "params": dict(row[2]) if len(row) > 2 else {}}
                _read_settings(ctx)
                return


def _read_settings(ctx: _Ctx) -> None:
    params = ctx.scanloss["params"]
    for m in ctx.take(_REDUCTION[0]):
        word = m.group("r") or m.group("r2") or m.group("r3") or "none"
        params["reduction"] = {"summed": "sum", "no": "none"}.get(word, word)
        ctx.note("loss", m.group(0).strip())
    for key, pattern in _SETTINGS.items():
        for m in ctx.take(pattern):
            params[key] = _number(m.group("v"))
            ctx.note("loss", m.group(0).strip())
    for key, pattern in _MODIFIERS.items():
        if ctx.take(pattern):
            params[key] = True
            ctx.note("scan" if key != "log_target" else "loss", key)
    # ("4096 logits" is a size: the sizes phase reads it as rows)
    ctx.take(r"\bloss(?:es)?\b|(?<!\d\s)\b(?:logits|predictions)\b|\b(?:embeddings|targets|labels|probabilities)\b")


def build_scanloss(ctx: _Ctx, op: str) -> KernelSpec:
    info = getattr(ctx, "scanloss")
    family, params = info["family"], dict(info["params"])
    _values(ctx, family)
    m, n, shape = _row_dims(ctx)
    _check_axis(ctx, len(shape), op)
    if family == "scan":
        wrong = sorted(set(params) - {"reverse", "exclusive", "masked"})
    else:
        wrong = sorted(k for k in ("reverse", "exclusive", "masked") if k in params)
    if wrong:
        raise _Fail(f"{', '.join(wrong)} is not something a {op} kernel takes.")
    if "ignore_index" in params:
        params["ignore_index"] = int(params["ignore_index"])
    if family == "loss" and "reduction" not in params:
        ctx.assume("no reduction given: the mean, as PyTorch's default")
    spec = KernelSpec(family, op, {"M": m, "N": n}, _dtype(ctx), params)
    try:
        family_of(spec).validate(spec)
    except ValueError as e:
        raise _Fail(f"that {op} is not valid: {e}") from None
    return spec

