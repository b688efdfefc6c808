"""What each config knob of the kernel families means, in words: the explainer's answer to
"what does ROWS_PER_PROG mean?" (a question about a knob, not a request for a mean)."""
from __future__ import annotations

import re

# knob -> meaning, for every family that has it; (family, knob) entries below say it for one family
GENERAL = {
    "num_warps": "warps per program (32 threads each): more warps hold a bigger tile in registers and hide "
                 "memory latency; too many for a small tile leave threads idle",
    "num_stages": "software-pipelining depth: how many tiles are loaded ahead into shared memory while the "
                  "current one is used; each stage costs one more tile of shared memory",
    "BLOCK_M": "rows of the output tile one program computes",
    "BLOCK_N": "columns of the output tile one program computes",
    "BLOCK_K": "the slice of the reduction (K) dimension one loop iteration multiplies",
    "GROUP_M": "tile order (swizzle): programs walk GROUP_M row tiles before moving to the next column "
               "tile, so the tiles they share stay in L2",
    "SPLIT_K": "the K loop cut into this many slices run by separate programs and summed after: more "
               "programs for a small output with a long K",
    "PERSISTENT": "a grid of about one program per SM that loops over the tiles, instead of one program "
                  "per tile (fewer launches of programs, better for many small tiles)",
    "PRECISION": "how fp32 products are computed: ieee (fp32 FMA), tf32x3 (three TF32 tensor-core products "
                 "per fp32 product, fp32 accuracy) or tf32 (one, lower accuracy; only when the spec allows it)",
    "ROWS_PER_PROG": "how many rows one program handles: several short rows per program give fewer, fuller "
                     "programs",
    "SPLIT": "each row cut into this many segments worked on side by side, then combined in a second pass: "
             "for few long rows that one program each could not spread over the GPU",
    "BLOCK": "the elements one program handles per step",
    "LAYOUT": "the activation read as given (nchw) or in channels-last order inside the group (the "
              "conversion is counted in the time)",
    "NORM_BLOCK": "the tile of the pass that applies the statistics (a split norm's second pass)",
    "WAVES": "programs per SM in the grid",
    "UNROLL": "the window's taps written out one by one in the kernel instead of a loop",
}
FAMILY = {
    ("conv", "ALGO"): "how the implicit GEMM walks its K dimension (input channels x kernel taps): taps "
                      "(taps outer, BLOCK_K channels inner: many channels), flat (the flattened channel-tap "
                      "index in BLOCK_K chunks: few channels) or direct (no GEMM: depthwise convs)",
    ("conv", "BLOCK_M"): "output pixels (batch x output positions) one program computes",
    ("conv", "BLOCK_N"): "output channels one program computes",
    ("conv", "BLOCK_K"): "the (input channel, tap) slice one loop iteration multiplies",
    ("pool", "ALGO"): "window (every output reads its own window) or plane (global pooling: a program "
                      "reduces whole planes)",
    ("pool", "BLOCK_P"): "planes (one batch item's channel) per program",
    ("pool", "BLOCK_R"): "output rows per program (or, for plane, input rows per chunk)",
    ("pool", "BLOCK_W"): "outputs along the innermost dim per program (or inputs, for plane)",
    ("norm", "BLOCK_P"): "batch items per program of a channel norm",
    ("norm", "BLOCK_T"): "channels per program of a channel norm",
    ("norm", "BLOCK_Q"): "spatial positions per program step of a channel norm",
    ("attention", "BLOCK_M"): "query rows one program owns",
    ("attention", "BLOCK_N"): "keys (and values) one loop iteration reads",
    ("attention", "BLOCK_E"): "the head dim of q and k, padded to a power of two",
    ("attention", "BLOCK_DV"): "the head dim of v, padded to a power of two",
    ("softmax", "BLOCK_N"): "the chunk of a row loaded at once (the whole row when it fits)",
    ("norm", "BLOCK_N"): "the chunk of a row loaded at once (the whole row when it fits)",
    ("reduction", "BLOCK_N"): "the chunk of a row loaded at once",
    ("scan", "BLOCK_N"): "the chunk of a row scanned at once in registers",
    ("loss", "BLOCK_N"): "the chunk of a row loaded at once",
}
_SPOKEN = {"warps": "num_warps", "stages": "num_stages", "pipeline stages": "num_stages",
           "split-k": "SPLIT_K", "split k": "SPLIT_K", "swizzle": "GROUP_M"}
_NAMES = sorted({*GENERAL, *(k for _, k in FAMILY)}, key=len, reverse=True)
# the spoken forms first: "split-k" is SPLIT_K, not SPLIT
KNOB_WORDS = re.compile(r"\b(" + "|".join(re.escape(s) for s in _SPOKEN) + r")\b|\b("
                        + "|".join(re.escape(n) for n in _NAMES) + r")\b", re.I)


def knobs_named(text: str) -> list[str]:
    """The knobs a question names, in the families' spelling (num_warps, BLOCK_N ...), in order."""
    out: list[str] = []
    for m in KNOB_WORDS.finditer(text):
        name = _SPOKEN[m.group(1).lower()] if m.group(1) else next(n for n in _NAMES if n.lower() == m.group(2).lower())
        if name not in out:
            out.append(name)
    return out


def meaning(family: str, knob: str) -> str | None:
    return FAMILY.get((family, knob)) or GENERAL.get(knob)


def glossary_lines(family: str, knobs: list[str], own: set[str], config: dict | None = None) -> list[str]:
    """'- KNOB: what it means (the kept draft's value)' for each named knob of `own` (the family's
    config space for this spec)."""
    lines = []
    for knob in knobs:
        text = meaning(family, knob) if knob in own else None
        if text is None:
            continue
        value = (config or {}).get(knob)
        lines.append(f"- {knob}: {text}" + (f" (the kept draft has {knob}={value})" if value is not None else "") + ".")
    return lines
