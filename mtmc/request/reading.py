"""Reading a request: the regex building blocks, the numbers, and the reading context (_Ctx)
that the phases take words from (each match is blanked out, so every word is used once).
Shared by the phases (request.phrases, request.formulas, request.words) and the builders."""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from mtmc.kernels import pointwise


DEFAULT_SIZE = 4096                      # rows, width or M=N=K when none is given (always stated)
DEFAULT_BMM = {"B": 32, "M": 512, "N": 512, "K": 512}
DEFAULT_LEAKY_SLOPE = 0.01               # PyTorch's default negative slope
MAX_DIM = 2**31 - 1                      # a size must fit int32 indexing
MAX_CHARS = 4000                         # longer text is a pasted module, not a request


class _Fail(Exception):
    """A request that cannot be served; the argument is the plain-words reason."""


# -- regex building blocks ------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _rx(pattern: str) -> re.Pattern:
    # ASCII: \d and \w mean 0-9 and [a-z0-9_] only, so int()/float() read every digit run.
    return re.compile(pattern, re.ASCII)


INT = r"(?<![\w.])\d+k?(?!\w|\.\d)"     # a size: 4096, or 4k (k = 1024)
_BASE = r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?"
NUM = (rf"(?<![\w.])(?:[-+]?{_BASE}(?:\s*/\s*(?:sqrt\s*\(\s*{_BASE}\s*\)|{_BASE}))?"
       rf"|sqrt\s*\(\s*{_BASE}\s*\))(?!\w|\.\d)")           # 0.5, 1e-5, 1/8, 1/sqrt(128)
# Words that order steps ("add a bias, then gelu"); they keep a step off the core's input.
_SEQ = r"\bthen\b|\bfollowed\s+by\b|\bafter(?:wards|\s+that)\b|\bfinally\b|\bnext\b|->"
_AFTER = r"\bafter\b(?!wards|\s+that)"
_BOUNDARY = _SEQ + r"|[,;]|\.(?!\d)"


def _number(text: str) -> float:
    text = re.sub(r"\s+", "", text)
    num, _, den = text.partition("/")
    if num.startswith("sqrt("):
        num, den = "1", ""
        value = math.sqrt(float(text[5:-1]))
    else:
        value = float(num)
    if den:
        d = math.sqrt(float(den[5:-1])) if den.startswith("sqrt(") else float(den)
        if d == 0:
            raise _Fail(f"'{text}' divides by zero.")
        value /= d
    if not math.isfinite(value):
        raise _Fail(f"the number '{text}' is too large to use.")
    return value


# -- the reading context --------------------------------------------------------------------

@dataclass
class _Item:
    """One recognised op: the core op of the kernel, or one pointwise step."""

    pos: float          # where its words start (orders the chain)
    end: int            # where they end
    words: str
    family: str = ""    # core: family and op (op None when the words do not say which)
    op: str | None = None
    step: dict | None = None
    formula: bool = False  # from a formula: its place before or after the core is settled
    pre: bool = False      # formula step applied to the core's input

    @property
    def is_core(self) -> bool:
        return self.step is None


_UNICODE = {"×": "x", "✕": "x", "−": "-", "–": "-", "—": "-", "→": "->", "’": "'", "‘": "'",
            "“": '"', "”": '"', "\u00a0": " "}


# "1,000,000 elements", "10^6 floats", "1e6 values": an element count written as a number.
_COUNT = (r"(?<![\w.,\[(])(?P<n>\d{1,3}(?:,\d{3})+|\d+e\+?\d+|\d+\s*(?:\^|\*\*)\s*\d+)"
          r"(?=[\s-]+(?:elements?|values|numbers|entries|floats)\b)")


def _count_digits(m: re.Match) -> str:
    parts = re.split(r"\s*(?:\^|\*\*)\s*|e\+?", m.group("n").replace(",", ""))
    if len(parts) == 1:
        return parts[0]
    b, e = int(parts[0]), min(int(parts[1]), 64)   # too large stays too large: refused as out of range
    return str(b * 10 ** e if "e" in m.group("n") else b ** e)


class _Ctx:
    def __init__(self, text: str):
        self.request = text
        norm = text.lower()
        for a, b in _UNICODE.items():
            norm = norm.replace(a, b)
        norm = _rx(_COUNT).sub(_count_digits, norm)
        self.norm = norm            # the whole request, lowercased
        self.s = norm               # the same with everything already used blanked out
        self.items: list[_Item] = []
        self.shapes: list[list[int]] = []
        self.sizes: dict[str, int] = {}
        self.values: dict[str, float] = {}   # eps, temperature: family parameters in words
        self.flags: set[str] = set()
        self.dtype: str | None = None
        self.reduce_dim: str | int | None = None
        self.understood: dict = {}
        self.assumptions: list[str] = []

    def take(self, pattern: str) -> list[re.Match]:
        """Every match of pattern in the text not used yet; the matches become used."""
        found = list(_rx(pattern).finditer(self.s))
        for m in found:
            self.s = self.s[:m.start()] + " " * (m.end() - m.start()) + self.s[m.end():]
        return found

    def note(self, key: str, value) -> None:
        self.understood.setdefault(key, []).append(value)

    def assume(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)

    def add_core(self, m: re.Match, family: str, op: str | None) -> None:
        self.items.append(_Item(m.start(), m.end(), m.group(0).strip(), family=family, op=op))
        self.note("ops", f"{m.group(0).strip()!r} -> {op or family}")

    def add_steps(self, m: re.Match, steps: list[dict]) -> None:
        for i, step in enumerate(steps):
            self.items.append(_Item(m.start() + i / 100, m.end(), m.group(0).strip(), step=step))
        self.note("ops", f"{m.group(0).strip()!r} -> {pointwise.describe_chain(steps)}")

    def size(self, key: str, value: int) -> None:
        old = self.sizes.get(key)
        if old is not None and old != value:
            raise _Fail(f"I found two different values for {_SIZE_NAMES[key]}: {old} and {value}.")
        self.sizes[key] = value
        self.understood.setdefault("sizes", {})[key] = value

    def value(self, key: str, value: float) -> None:
        """A family parameter given in words or a formula (eps, temperature)."""
        if key in self.values and self.values[key] != value:
            raise _Fail(f"I found two different values for {key}: {self.values[key]:g} and {value:g}.")
        self.values[key] = value
        self.understood[key] = value

    def to_int(self, token: str) -> int:
        token = token.strip()
        value = int(token[:-1]) * 1024 if token.endswith("k") else int(token)
        if token.endswith("k"):
            self.assume(f"read '{token}' as {value} (k = 1024)")
        if not 1 <= value <= MAX_DIM:
            raise _Fail(f"the size {token} is out of range: sizes must be between 1 and {MAX_DIM}.")
        return value


_SIZE_NAMES = {"rows": "the number of rows", "cols": "the row width", "batch": "the batch size",
               "seq": "the sequence length", "in_features": "the input features",
               "out_features": "the output features", "M": "M", "N": "N", "K": "K", "B": "B"}

def _vocabulary() -> str:
    return ", ".join([*pointwise.UNARY, *pointwise.SCALAR, *pointwise.BINARY, *pointwise.VECTOR])
