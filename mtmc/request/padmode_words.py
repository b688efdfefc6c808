"""A conv request's padding mode in words: "reflect padding 1", "replicate-padded", "circular
padding", "padding_mode='reflect'", "reflection padding" (conv_words asks here first, so the
padding size after the mode word is still read by its own pattern)."""
from __future__ import annotations

from mtmc.request.reading import _Ctx, _Fail

_MODES = {"reflect": "reflect", "reflection": "reflect", "reflective": "reflect", "reflected": "reflect",
          "mirror": "reflect", "replicate": "replicate", "replicated": "replicate", "replication": "replicate",
          "edge": "replicate", "circular": "circular", "wrap": "circular", "periodic": "circular", "zeros": "zeros"}
_PATTERNS = [r"\bpadding[\s_-]*mode\s*(?:=|:|is)?\s*['\"]?(?P<m>[a-z]+)['\"]?",
             r"\b(?P<m>reflect(?:ion|ive|ed)?|mirror|replicat(?:e|ed|ion)|edge|circular|wrap|periodic)"
             r"(?:[\s_-]*padded\b|(?=[\s_-]*pad))"]   # "reflect-padded" is all mode; "reflect padding 1" leaves the size


def read_padding_mode(ctx: _Ctx, conv: dict) -> None:
    """conv["padding_mode"] from the request's words (left unset when they name none)."""
    for pattern in _PATTERNS:
        for m in ctx.take(pattern):
            mode = _MODES.get(m.group("m"))
            if mode is None:
                raise _Fail(f"unknown padding mode {m.group('m')!r}: reflect, replicate, circular or zeros.")
            if conv.get("padding_mode", mode) != mode:
                raise _Fail(f"the request names two padding modes: {conv['padding_mode']} and {mode}.")
            conv["padding_mode"] = mode
            ctx.note("conv", m.group(0).strip())
