"""Reading a request: the regex building blocks, the numbers, and the reading context (_Ctx)
that the phases take words from (each match is blanked out, so every word is used once).
Shared by the phases (request.phrases, request.formulas, request.words) and the builders."""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from mtmc.kernels import pointwise
from mtmc.request.torch_calls import closing, rewrite_calls


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


INT = r"(?<![\w.])\d+[km]?(?!\w|\.\d)"     # a size: 4096, 4k (k = 1024), 4m (m = 2^20)
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


# "1,000,000 elements", "1 000 000 float32 values", "10^6 floats", "1e6 values": an element count
# written as a number.  Separators and powers are read only before a count noun (a dtype or an
# adjective may sit between), where they cannot be a shape such as "8,128,128".
_COUNT_NOUN = r"(?:elements?|values|numbers|entries|floats|scalars|rows|columns|cols|tokens|samples)"
_COUNT_FILL = r"(?:(?:fp|float|bf|bfloat)[\s_-]?(?:16|32)|half|single|f16|f32|random|input|contiguous)"
_COUNT = (r"(?<![\w.,\[(])(?P<n>\d{1,3}(?:,\d{3})+|\d{1,3}(?: \d{3})+|\d+e\+?\d+|\d+\s*(?:\^|\*\*)\s*\d+)"
          rf"(?=[\s-]+(?:{_COUNT_FILL}[\s-]+){{0,2}}{_COUNT_NOUN}\b)")
# "vectors of length 1,000,000": a grouped number after length / size is one size too
_LENGTH_GROUPED = r"(?P<pre>\b(?:length|size|numel)\s+(?:of\s+|=\s*)?)(?P<n>\d{1,3}(?:,\d{3})+)(?![\w,.])"
# "the log-probabilities", "log-scale values" name what a tensor holds: no log step
_LOG_NOUN = r"\blog[\s_-]+(probs?|probabilit\w*|likelihoods?|space|scale|domain|densit\w*|odds|values)\b"
# "64 RGB images 224x224": the kind of image says its channel count
_IMAGE_KIND = r"\b(?P<k>rgba|rgb|colou?r|gr[ae]y(?:scale)?|mono(?:chrome)?)[\s-]+images?\b"
_IMAGE_CHANNELS = {"rgba": 4, "rgb": 3, "colo": 3, "gray": 1, "grey": 1, "mono": 1}
# "4 million elements": number words are never sizes of their own, so they are read anywhere.
_MILLION = r"(?<![\w.])(?P<n>\d+(?:\.\d+)?)\s*(?P<w>thousand|million|billion)\b"
_WORD_POWERS = {"thousand": 10**3, "million": 10**6, "billion": 10**9}


def _count_digits(m: re.Match) -> str:
    parts = re.split(r"\s*(?:\^|\*\*)\s*|e\+?", re.sub(r"[, ]", "", m.group("n")))
    if len(parts) == 1:
        return parts[0]
    b, e = int(parts[0]), min(int(parts[1]), 64)   # too large stays too large: refused as out of range
    return str(b * 10 ** e if "e" in m.group("n") else b ** e)


def _number_word(m: re.Match) -> str:
    value = float(m.group("n")) * _WORD_POWERS[m.group("w")]
    return str(int(value)) if value == int(value) else m.group(0)   # "1.0000005 million": left to refuse


# no space before "(": "4096x14336 bf16 (the gate)" is words, not a call
_CALL_OPEN = r"(?<![\w.])(?:[a-z_][a-z0-9_]*\.)*[a-z_][a-z0-9_]*\("
# the names a formula reads tensors by (formulas._is_formula takes the same)
VARS = (r"[a-z][0-9]?|input|inputs|inp|bias|residual|res|skip|shortcut|weight|hidden|other|gate|up|down|lhs|rhs"
        r"|pred|target|logits"
        r"|scores|act|mask")
_TENSOR_VAR = rf"(?<![\w.])(?:{VARS})(?=\s*(?:[-,)*+/^@]|\*\*|\.\w|$))"


def _tensor_calls(text: str) -> list[tuple[int, int]]:
    """Spans of `name(...)` whose arguments name a tensor (x, y, input ...), or that are a method of
    one (`x.clamp(0, 1)`: its numbers are no shape): formulas."""
    spans = []
    for m in _rx(_CALL_OPEN).finditer(text):
        end = closing(text, m.end(), {"(": 1, ")": -1})
        method = _rx(rf"(?:{VARS})\.").match(text, m.start()) is not None
        if end is not None and (method or _rx(_TENSOR_VAR).search(text[m.end():end - 1])):
            while (more := _rx(r"\.[a-z_]\w*\(").match(text, end)) is not None:   # x.exp().sum(-1).log()
                after = closing(text, more.end(), {"(": 1, ")": -1})
                if after is None:
                    break
                end = after
            spans.append((m.start(), end))
    return spans


class _Ctx:
    def __init__(self, text: str):
        self.request = text
        norm = text.lower()
        for a, b in _UNICODE.items():
            norm = norm.replace(a, b)
        norm = _rx(_COUNT).sub(_count_digits, norm)
        norm = _rx(_LENGTH_GROUPED).sub(lambda m: m.group("pre") + _count_digits(m), norm)
        norm = _rx(_MILLION).sub(_number_word, norm)
        norm = _rx(_LOG_NOUN).sub(lambda m: "log" + m.group(1), norm)   # "log-probs": a noun, no log op
        norm = _rx(_IMAGE_KIND).sub(lambda m: f"images with {_IMAGE_CHANNELS[m.group('k')[:4]]} channels", norm)
        norm = rewrite_calls(norm)  # nn.Conv2d(3, 64, kernel_size=3) -> the words the op phases read
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
        # calls on a tensor ("sqrt(relu(x))", "F.elu(x, alpha=0.5)") are the formula phase's: the
        # word phases before it once took their function names as words, in the order written
        # (sqrt then relu), and the formula was lost
        self.calls = _tensor_calls(norm)

    def take(self, pattern: str) -> list[re.Match]:
        """Every match of pattern in the text not used yet (and outside the calls on a tensor the
        formula phase reads); the matches become used."""
        found = [m for m in _rx(pattern).finditer(self.s)
                 if not any(a <= m.start() < b for a, b in self.calls)]
        for m in found:
            self.s = self.s[:m.start()] + " " * (m.end() - m.start()) + self.s[m.end():]
        return found

    def use(self, start: int, end: int) -> None:
        """Mark text[start:end] used (a match found in the whole request, not in what is left)."""
        self.s = self.s[:start] + " " * (end - start) + self.s[end:]

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
        unit = _SUFFIX.get(token[-1:])
        value = int(token[:-1]) * unit[0] if unit else int(token)
        if unit:
            self.assume(f"read '{token}' as {value} ({token[-1]} = {unit[1]})")
        if not 1 <= value <= MAX_DIM:
            raise _Fail(f"the size {token} is out of range: sizes must be between 1 and {MAX_DIM}.")
        return value


_SUFFIX = {"k": (1024, "1024"), "m": (1024 * 1024, "2^20")}   # binary, like the k every kernel author means

MATMUL_WORDS = r"(?:matmul|mat[\s_-]mul|gemm|[shd]gemm|mm|matrix[\s_-]*(?:multipl\w*|products?|mult))"

_SIZE_NAMES = {"rows": "the number of rows", "cols": "the row width", "batch": "the batch size",
               "seq": "the sequence length", "in_features": "the input features",
               "out_features": "the output features", "channels": "the number of channels",
               "M": "M", "N": "N", "K": "K", "B": "B"}

def _vocabulary() -> str:
    return ", ".join([*pointwise.UNARY, *pointwise.SCALAR, *pointwise.BINARY, *pointwise.VECTOR])
