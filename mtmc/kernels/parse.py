"""Words -> KernelSpec, deterministically (no LLM).

`parse_request("a fused softmax over the rows of a 4096x8192 fp16 tensor")` returns a
ParseResult: the spec, what was recognised, what had to be assumed (stated defaults for a
missing shape or dtype), and a message.  Nothing is guessed silently: an op outside the catalog,
a contradiction, a number it cannot place or an unsupported axis is a failure whose message
says what was understood and what can be asked for.  It never raises.

How a request is read: the text is lowercased, then phases take what they recognise and blank
it out, so every word and number is used once ("rms norm" is not also a "mean"):
  context phrases and clamps -> dtype -> sizes and shapes -> formulas ("relu(x + y)")
  -> op words -> reduce axis.
Afterwards no number and no op verb ("add", "scale") may be left over.  The op words give at
most one core op (softmax, rmsnorm, matmul ...) plus pointwise steps (pointwise.py vocabulary);
their order in the text ("after" reverses it) is the chain order; the family's builder turns
that into dims and params.

An LLM parser can be added as a fallback behind the same interface: text in, ParseResult out.
"""
from __future__ import annotations

import difflib
import functools
import math
import re
from dataclasses import dataclass, field

from mtmc.kernels import pointwise
from mtmc.kernels.spec import DTYPE_ALIASES, KernelSpec

DEFAULT_SIZE = 4096                      # rows, width or M=N=K when none is given (always stated)
DEFAULT_BMM = {"B": 32, "M": 512, "N": 512, "K": 512}
DEFAULT_LEAKY_SLOPE = 0.01               # PyTorch's default negative slope
MAX_DIM = 2**31 - 1                      # a size must fit int32 indexing
MAX_CHARS = 4000                         # longer text is a pasted module, not a request

# What each family can be asked for; mirrors the catalog without importing the templates.
FAMILY_OPS = {
    "elementwise": ("chain",),
    "reduction": ("sum", "mean", "max", "min", "argmax", "argmin"),
    "softmax": ("softmax", "log_softmax"),
    "norm": ("layernorm", "rmsnorm"),
    "matmul": ("matmul", "bmm"),
    "conv": ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"),
}


@dataclass
class ParseResult:
    """spec is None when the request could not be served; message then says why."""

    spec: KernelSpec | None
    understood: dict = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.spec is not None


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


# -- phase 1: nn.Linear calls, context phrases, negations, clamps --------------------------

_DTYPE_WORD = r"(?:fp|float|bf|bfloat)[\s_-]?(?:16|32)|half|single|float|f16|f32"
_CONTEXT = [
    # Words that describe a kernel's inside or its data, not an op to add.
    r"\battention\s+(?:scores|logits|weights|probs|probabilities|matrix|map)\b",
    r"\bsubtract(?:s|ing)?\s+the\s+(?:row\s+|running\s+)?(?:max|maximum|mean)\b",
    r"\bmax[\s_-]*subtraction\b|\bnumerically\s+stable\b|\bmean\s+and\s+var(?:iance)?\b",
    rf"\b(?:accumulat\w*|accum)\s+(?:in\s+)?(?:{_DTYPE_WORD})\b|\b(?:{_DTYPE_WORD})\s+accumulat\w*",
    r"\b(?:int32|int64)\s+(?:indices|index)\b",
    r"\b[1-9][\s-]?d\b(?!\s*[=:])",                     # "a 3d tensor", "2-d"
]
_NEGATION = (r"\b(?:without|no|w/o)\s+(?:an?\s+|any\s+)?(?P<what>bias|residual)\b"
             r"|\b(?P<what2>bias)\s*=\s*false\b")
_NO_AFFINE = (r"\b(?:without|no)\s+(?:an?\s+|the\s+)?(?:affine|learn\w+\s+(?:weights?|parameters|params)"
              r"|weights?(?:\s+and\s+bias)?|gamma(?:\s+and\s+beta)?)\b"
              r"|\b(?:elementwise_)?affine\s*=\s*false\b")
_AFFINE = (r"\bwith\s+(?:an?\s+|the\s+)?(?:learn\w+\s+)?(?:weights?|gamma|scale)"
           r"(?:\s+and\s+(?:a\s+)?(?:bias|beta|shift))?\b(?!\s*(?:of|=|:|by)?\s*[-+\d.])"
           r"|\bwith\s+(?:an?\s+)?bias\b|\b(?:elementwise_)?affine(?:\s*=\s*true)?\b|\bgamma(?:\s+and\s+beta)?\b")
_NORM_WORD = r"\b(?:layer|rms)[\s_-]*norm"
_CLAMP_VERB = r"\b(?:clamp|clip)(?:ed|ping|s)?(?:\s+(?:it|x|the\s+\w+|values?))?"
_CLAMPS = [  # (pattern, which bounds its groups a/b give)
    (rf"{_CLAMP_VERB}\s+(?:to|between|in|within|into|at)?\s*(?:the\s+range\s+)?[\[(]?\s*(?P<a>{NUM})"
     rf"\s*(?:,|and|to|\.\.)\s*(?P<b>{NUM})\s*[\])]?", "range"),
    (rf"\bclamp_(?P<side>min|max)\s*[=:(]?\s*(?:of\s+|at\s+|to\s+)?(?P<a>{NUM})\)?", "side"),
    (rf"{_CLAMP_VERB}(?:\s+from)?\s+(?:(?:at|to|with)\s+)?(?:an?\s+|the\s+)?(?P<side>min|minimum|max|maximum|below"
     rf"|above|lower\s+bound|upper\s+bound)(?:\s+(?:of|at|to))?\s*[=:]?\s*(?P<a>{NUM})", "side"),
]
_LINEAR_CALL = (rf"\b(?:nn\.)?linear\s*\(\s*(?:in_features\s*=\s*)?({INT})\s*,\s*(?:out_features\s*=\s*)?({INT})"
                r"\s*(?:,\s*bias\s*=\s*(true|false)\s*)?\)")


def _read_context(ctx: _Ctx) -> None:
    for m in ctx.take(_LINEAR_CALL):   # first: its bias=False belongs to the call, not a negation
        _linear_call(ctx, m)
    for pattern in _CONTEXT:
        for m in ctx.take(pattern):
            ctx.note("context", m.group(0).strip())
    for m in ctx.take(r"\bsquare\s+(?=(?:\w+\s+)?(?:matrix|matrices|matmul|gemm|shapes?)\b)"):
        ctx.flags.add("square")
    for m in ctx.take(_NEGATION):
        ctx.flags.add("no_" + (m.group("what") or m.group("what2")))
        ctx.note("context", m.group(0).strip())
    if _rx(_NORM_WORD).search(ctx.s):
        for m in ctx.take(_NO_AFFINE):
            ctx.flags.add("no_affine")
            ctx.note("context", m.group(0).strip())
        for m in ctx.take(_AFFINE):
            ctx.note("context", f"{m.group(0).strip()} (the norm's own weight/bias)")
            if re.search(r"bias|beta|shift", m.group(0)):
                ctx.flags.add("norm_bias")
    for pattern, kind in _CLAMPS:
        for m in ctx.take(pattern):
            ctx.add_steps(m, _clamp_steps(m, kind))


def _linear_call(ctx: _Ctx, m: re.Match) -> None:
    """nn.Linear(4096, 11008[, bias=...]): the weight sizes, and its bias (on by default)."""
    ctx.size("in_features", ctx.to_int(m.group(1)))
    ctx.size("out_features", ctx.to_int(m.group(2)))
    ctx.add_core(m, "matmul", "matmul")
    ctx.flags.add("nk")
    said = m.group(3)
    rest = ctx.norm[:m.start()] + ctx.norm[m.end():]
    if said == "true" or (said is None and not re.search(r"\bbias\b", rest)):
        ctx.add_steps(m, [{"op": "bias"}])
        if said is None:
            ctx.assume("nn.Linear has a bias unless bias=False: fusing the bias add")


def _clamp_steps(m: re.Match, kind: str) -> list[dict]:
    a = _number(m.group("a"))
    if kind == "range":
        b = _number(m.group("b"))
        if a > b:
            raise _Fail(f"'{m.group(0).strip()}' asks for a lower bound {a:g} above the upper bound {b:g}.")
        return [{"op": "clamp_min", "value": a}, {"op": "clamp_max", "value": b}]
    lower = m.group("side") in ("min", "minimum", "below") or m.group("side").startswith("lower")
    return [{"op": "clamp_min" if lower else "clamp_max", "value": a}]


# -- phase 2: dtype -------------------------------------------------------------------------

_INT_WORD = r"(?:int|ints|integers?|long|longs|bool|booleans?|short|byte|doubles?)"
_BAD_DTYPES = (r"\b(?:fp8|float8\w*|e4m3\w*|e5m2\w*|u?int(?:4|8|16|32|64)|fp64|float64|f64|complex\w*"
               r"|double[\s_-]*precision|torch\.(?:double|long|int|bool))\b"
               # "a 64x64 int tensor", "in double", "a tensor of doubles" (not "double the values")
               rf"|\b{_INT_WORD}(?=(?:\s+\d[\dxk*\s]*)?\s+(?:tensors?|matri\w*|arrays?|inputs?|vectors?|values|elements)\b)"
               rf"|(?<=\b(?:in|of|as)\s){_INT_WORD}\b(?!\s+(?:the|it|its|each|every|all|x|them|values?)\b)"
               rf"|\bdtype\s*[=:]?\s*{_INT_WORD}\b|(?<=\d\s){_INT_WORD}\b")
_TF32 = r"\btf[\s_-]?32\b"


def _dtype_words() -> tuple[str, dict[str, str]]:
    """Regex for every dtype alias ("fp16", "fp 16", "half precision") and its reading table."""
    table = {re.sub(r"[\s_-]", "", k): v for k, v in DTYPE_ALIASES.items() if k != "single"}
    table.update({"halfprecision": "float16", "singleprecision": "float32"})
    alts = [r"(?:half|single)[\s_-]*precision"]
    for alias in sorted(DTYPE_ALIASES, key=len, reverse=True):
        if alias == "single":   # "a single kernel": only "single precision" names a dtype
            continue
        p = re.escape(alias).replace(r"\ ", r"[\s_-]*")
        alts.append(re.sub(r"(?<=[a-z])(?=\d)", lambda _: r"[\s_-]?", p))
    return r"\b(?:" + "|".join(alts) + r")\b", table


_DTYPE_RX, _DTYPE_TABLE = _dtype_words()


def _read_dtype(ctx: _Ctx) -> None:
    bad = ctx.take(_BAD_DTYPES)
    if bad:
        ctx.understood["dtype"] = bad[0].group(0)
        raise _Fail(f"the dtype '{bad[0].group(0)}' is not supported: I write float32, float16 and "
                    "bfloat16 kernels.")
    found = {_DTYPE_TABLE[re.sub(r"[\s_-]", "", m.group(0))] for m in ctx.take(_DTYPE_RX)}
    if ctx.take(_TF32):   # a compute mode, not a storage dtype
        found.add("float32")
        ctx.assume("tf32 read as float32: the kernel reads and writes float32 and multiplies in IEEE fp32 "
                   "(as exact as PyTorch's default, no TF32)")
    if len(found) > 1:
        ctx.understood["dtype"] = sorted(found)
        raise _Fail(f"the request names more than one dtype ({', '.join(sorted(found))}); a kernel here "
                    "reads and writes one dtype, so say which.")
    if found:
        ctx.dtype = found.pop()
        ctx.understood["dtype"] = ctx.dtype


# -- phase 3: sizes and shapes --------------------------------------------------------------

_TUPLE = (rf"\[\s*{INT}(?:\s*,\s*{INT})*\s*,?\s*\]|\(\s*{INT}(?:\s*,\s*{INT})+\s*,?\s*\)"
          rf"|\(\s*{INT}\s*,\s*\)")
_XSHAPE = r"(?<![\w.])\d+k?(?:\s*[x*]\s*\d+k?)+(?!\w|\.\d)"
_BY_SHAPE = rf"{INT}(?:\s+by\s+{INT})+"
_NAMED = rf"\b(?P<dims>(?:[bmnk]\s*[=:]\s*)+)(?P<v>{INT})"     # M=4096, M=N=K=1024
_ROWS = r"(?:rows|tokens|vectors|samples|examples|items)\b"
_SIZE_WORDS = [  # (pattern, the size each group gives); specific phrasings first
    (rf"\b(?:a\s+)?batch\s+of\s+({INT})\s+{_ROWS}", ("rows",)),
    (rf"({INT})\s+{_ROWS}", ("rows",)),
    (rf"\b(?:num[\s_]*|n[\s_]*)?(?:rows|tokens)\s*[=:]\s*({INT})", ("rows",)),
    (rf"\b(?:in[\s_-]*features|input[\s_-]*(?:size|dim\w*|features)|d[\s_-]*in)\s*(?:=|:|of|is)?\s*({INT})",
     ("in_features",)),
    (rf"({INT})\s+(?:inputs?|input[\s_-]*(?:features|dims?|units|channels))\b", ("in_features",)),
    (rf"\b(?:out[\s_-]*features|output[\s_-]*(?:size|dim\w*|features)|d[\s_-]*out)\s*(?:=|:|of|is)?\s*({INT})",
     ("out_features",)),
    (rf"({INT})\s+(?:outputs?|output[\s_-]*(?:features|dims?|units|channels))\b", ("out_features",)),
    (rf"\bfrom\s+({INT})\s+to\s+({INT})\b", ("in_features", "out_features")),
    (rf"({INT})\s*->\s*({INT})", ("in_features", "out_features")),
    (rf"\bbatch(?:[\s_-]*size)?\s*(?:of|=|:|is)?\s*({INT})", ("batch",)),
    (rf"({INT})\s+(?:batch(?:es)?|sequences|sentences|images)\b", ("batch",)),
    (rf"\b(?:seq(?:uence)?[\s_-]*len(?:gth)?|seqlen|context[\s_-]*(?:length|len))\s*(?:of|=|:|is)?\s*({INT})",
     ("seq",)),
    (rf"\brows?\s+of\s+(?:size\s+|length\s+|width\s+)?({INT})(?:\s+elements)?", ("cols",)),
    (rf"\b(?:width|row[\s_-]*(?:length|size|width)|hidden(?:[\s_-]*(?:size|dim\w*))?|d[\s_-]*model"
     rf"|embed\w*[\s_-]*(?:size|dim\w*)|feature[\s_-]*(?:size|dim\w*)|last[\s_-]*dim\w*|cols|columns"
     rf"|num[\s_]*cols|n[\s_]*cols|vocab\w*(?:[\s_-]*size)?)\s*(?:of|=|:|is)?\s*({INT})", ("cols",)),
    (rf"({INT})\s+(?:columns|cols|features|channels|hidden)\b", ("cols",)),
    (rf"({INT})[\s-]+wide\b", ("cols",)),
]
_VECTORS = [rf"(?<=bias)\s+(?:vector\s+)?(?:of\s+)?(?:size\s+|length\s+|shape\s+)?({INT})",
            rf"\b(?:vector|array)\s+of\s+(?:size\s+|length\s+)?({INT})(?:\s+elements)?",
            rf"({INT})[\s-]+(?:elements?|values|numbers|entries|floats)\b(?:\s+(?:vector|array|tensor))?"]


def _read_sizes(ctx: _Ctx) -> None:
    for pattern, split in ((_TUPLE, r"[^\dk]+"), (_XSHAPE, r"\s*[x*]\s*")):
        for m in ctx.take(pattern):
            _add_shape(ctx, m, [t for t in re.split(split, m.group(0)) if t])
    for m in ctx.take(_NAMED):
        for dim in re.findall(r"[bmnk]", m.group("dims")):
            ctx.size(dim.upper(), ctx.to_int(m.group("v")))
    for pattern, keys in _SIZE_WORDS:
        for m in ctx.take(pattern):
            for key, token in zip(keys, m.groups()):
                ctx.size(key, ctx.to_int(token))
    for m in ctx.take(_BY_SHAPE):
        _add_shape(ctx, m, re.split(r"\s+by\s+", m.group(0)))
    for pattern in _VECTORS:
        for m in ctx.take(pattern):
            _add_shape(ctx, m, [m.group(1)])


def _add_shape(ctx: _Ctx, m: re.Match, tokens: list[str]) -> None:
    shape = [ctx.to_int(t) for t in tokens]
    # "two 4096x4096 matrices": the same shape for both operands.
    copies = 2 if _rx(r"\b(?:two|both)\s+$").search(ctx.s[:m.start()]) else 1
    if copies == 2:
        ctx.flags.add("pair")
    for _ in range(copies):
        ctx.shapes.append(shape)
        ctx.note("shapes", shape)


# -- phase 4: formulas ("relu(x + y)", "x @ W^T + b") ----------------------------------------

_TOKEN = (r"\s*(?:(?P<arrow>->)|(?P<num>(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)"
          r"|(?P<name>[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)|(?P<str>'[a-z_]*'|\"[a-z_]*\")"
          r"|(?P<op>\*\*|[-+*/@^(),=])|(?P<other>\S))")
_BIN_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "@": 2, "**": 4, "^": 4}
_NAMESPACES = {"torch", "nn", "functional", "f", "math", "tl", "np", "numpy", "triton", "special"}
_VARS = (r"[a-z][0-9]?|input|inputs|inp|bias|residual|res|skip|shortcut|weight|hidden|other|gate|logits"
         r"|scores|act|mask")
_BIAS_NAMES = {"b", "bias"}
_RESIDUAL_NAMES = {"r", "res", "residual", "skip", "shortcut"}
_MAIN_NAMES = ("x", "input", "inputs", "inp", "a", "h", "hidden", "logits", "scores", "act")
_UNARY_FUNCS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "swish": "silu", "sigmoid": "sigmoid",
                "tanh": "tanh", "exp": "exp", "abs": "abs", "neg": "neg", "negative": "neg",
                "square": "square"}
_CORE_FUNCS = {"softmax": ("softmax", "softmax"), "log_softmax": ("softmax", "log_softmax"),
               "logsoftmax": ("softmax", "log_softmax"), "layer_norm": ("norm", "layernorm"),
               "layernorm": ("norm", "layernorm"), "rms_norm": ("norm", "rmsnorm"),
               "rmsnorm": ("norm", "rmsnorm"), "sum": ("reduction", "sum"), "mean": ("reduction", "mean"),
               "amax": ("reduction", "max"), "amin": ("reduction", "min"),
               "argmax": ("reduction", "argmax"), "argmin": ("reduction", "argmin")}
_BOUND_FUNCS = {"max": "clamp_min", "maximum": "clamp_min", "fmax": "clamp_min",
                "min": "clamp_max", "minimum": "clamp_max", "fmin": "clamp_max"}
_OTHER_FUNCS = {"leaky_relu", "relu6", "clamp", "clip", "clamp_min", "clamp_max", "linear", "sqrt", "t",
                "transpose"}
# Known functions outside the vocabulary: a formula using them fails with a clear reason.
_UNSUPPORTED_FUNCS = {"log", "log1p", "log2", "sin", "cos", "tan", "softplus", "mish", "elu", "selu", "celu",
                      "hardswish", "hardsigmoid", "hardtanh", "erf", "rsqrt", "reciprocal", "pow", "floor",
                      "ceil", "round", "sign", "div", "dropout", "conv2d", "conv1d", "cumsum", "var", "std"}
_KNOWN_FUNCS = (set(_UNARY_FUNCS) | set(_CORE_FUNCS) | set(_BOUND_FUNCS) | _OTHER_FUNCS
                | _UNSUPPORTED_FUNCS)


class _NoFormula(Exception):
    """The tokens at this place do not form an expression."""


class _FormulaParser:
    """Precedence-climbing parser over tokens; nodes are tuples:
    ("num", v) ("name", s) ("str", s) ("call", name, args, kwargs) ("bin", op, l, r) ("neg", a) ("T", a)."""

    def __init__(self, toks: list[tuple[str, str, int, int]]):
        self.toks = toks
        self.i = 0
        self.depth = 0

    def parse_at(self, i: int):
        self.i, self.depth = i, 0
        return self.expr(0)

    def peek(self, kind: str | None = None, text: str | None = None):
        if self.i >= len(self.toks):
            return None
        tok = self.toks[self.i]
        if (kind and tok[0] != kind) or (text and tok[1] != text):
            return None
        return tok

    def expect(self, kind: str, text: str | None = None):
        tok = self.peek(kind, text)
        if tok is None:
            raise _NoFormula
        self.i += 1
        return tok

    def expr(self, min_prec: int):
        self.depth += 1
        if self.depth > 40:
            raise _NoFormula
        left = self.unary()
        while (tok := self.peek("op")) and tok[1] in _BIN_PREC and _BIN_PREC[tok[1]] >= min_prec:
            if tok[1] == "^" and self.i + 1 < len(self.toks) and self.toks[self.i + 1][1] == "t":
                break  # W^T is a transpose, read by postfix()
            self.i += 1
            right_assoc = tok[1] in ("**", "^")
            left = ("bin", tok[1], left, self.expr(_BIN_PREC[tok[1]] + (0 if right_assoc else 1)))
        self.depth -= 1
        return left

    def unary(self):
        if self.peek("op", "-"):
            self.i += 1
            return ("neg", self.unary())
        if self.peek("op", "+"):
            self.i += 1
            return self.unary()
        return self.postfix(self.primary())

    def postfix(self, node):
        while self.peek("op", "^") and self.i + 1 < len(self.toks) and self.toks[self.i + 1][1] == "t":
            self.i += 2
            node = ("T", node)
        return node

    def primary(self):
        tok = self.peek()
        if tok is None:
            raise _NoFormula
        kind, text = tok[0], tok[1]
        if kind == "num":
            self.i += 1
            return ("num", float(text))
        if kind == "str":
            self.i += 1
            return ("str", text.strip("'\""))
        if kind == "name":
            self.i += 1
            return self.call(text) if self.peek("op", "(") else ("name", text)
        if kind == "op" and text == "(":
            self.i += 1
            node = self.expr(0)
            self.expect("op", ")")
            return node
        raise _NoFormula

    def call(self, name: str):
        self.expect("op", "(")
        args, kwargs = [], {}
        while not self.peek("op", ")"):
            if self.peek("op", ","):   # an empty slot: a shape there was already read and blanked
                self.i += 1
                continue
            if self.peek("name") and self.i + 1 < len(self.toks) and self.toks[self.i + 1][1] == "=":
                key = self.toks[self.i][1]
                self.i += 2
                kwargs[key] = self.expr(0)
            else:
                args.append(self.expr(0))
            if not self.peek("op", ","):
                break
            self.i += 1
        self.expect("op", ")")
        return ("call", name, args, kwargs)


def _resolve(node):
    """Strip namespaces (torch.relu -> relu), turn methods into calls (x.sum() -> sum(x)) and
    transposes into T nodes (w.t, w.T(), w.transpose(0, 1))."""
    kind = node[0]
    if kind == "name":
        parts = _strip_ns(node[1])
        if len(parts) == 2 and parts[1] in ("t", "mt"):
            return ("T", ("name", parts[0]))
        return ("name", ".".join(parts))
    if kind == "call":
        parts = _strip_ns(node[1])
        args = [_resolve(a) for a in node[2]]
        kwargs = {k: _resolve(v) for k, v in node[3].items()}
        if len(parts) == 2:                       # method call: receiver first
            if parts[1] in ("t", "transpose", "mt"):
                return ("T", ("name", parts[0]))
            return ("call", parts[1], [("name", parts[0]), *args], kwargs)
        return ("call", ".".join(parts), args, kwargs)
    if kind == "bin":
        return ("bin", node[1], _resolve(node[2]), _resolve(node[3]))
    if kind in ("neg", "T"):
        return (kind, _resolve(node[1]))
    return node


def _strip_ns(dotted: str) -> list[str]:
    parts = dotted.split(".")
    while len(parts) > 1 and parts[0] in _NAMESPACES:
        parts = parts[1:]
    return parts


def _leaves(node, kind: str) -> list:
    """Names of the leaves (kind "name") or of the called functions (kind "call"), in order."""
    out = []
    if node[0] == kind:
        out.append(node[1])
    children = (node[2] + list(node[3].values())) if node[0] == "call" else \
        [c for c in node[1:] if isinstance(c, tuple)]
    for child in children:
        out.extend(_leaves(child, kind))
    return out


def _is_formula(node) -> bool:
    """A real formula: an operator or call, over variable names, calling known functions only."""
    if node[0] in ("name", "num", "str"):
        return False
    names, calls = _leaves(node, "name"), _leaves(node, "call")
    return (bool(names) and all(_rx(rf"(?:{_VARS})").fullmatch(n) for n in names)
            and all(c in _KNOWN_FUNCS for c in calls))


def _tokens(text: str) -> list[tuple[str, str, int, int]]:
    toks = []
    for m in _rx(_TOKEN).finditer(text):
        kind = m.lastgroup
        toks.append((kind, m.group(kind), m.start(kind), m.end(kind)))
    return toks


def _read_formulas(ctx: _Ctx) -> None:
    toks = _tokens(ctx.s)
    parser = _FormulaParser(toks)
    i = 0
    while i < len(toks):
        try:
            node = _resolve(parser.parse_at(i))
        except _NoFormula:
            node = None
        if node is None or not _is_formula(node):
            i += 1
            continue
        start, end = toks[i][2], toks[parser.i - 1][3]
        ctx.s = ctx.s[:start] + " " * (end - start) + ctx.s[end:]
        ctx.note("formula", ctx.norm[start:end])
        _formula_items(ctx, node, start, end)
        i = parser.i


def _formula_items(ctx: _Ctx, node, start: int, end: int) -> None:
    """Items for a formula, in application order; steps before its core op apply to the input."""
    names = _leaves(node, "name")
    main = next((n for n in _MAIN_NAMES if n in names), names[0])
    entries = _Walker(main, ctx).walk(node)
    words = ctx.norm[start:end].strip()
    core_at = next((i for i, e in enumerate(entries) if e[0] == "core"), None)
    for i, entry in enumerate(entries):
        pos = start + i / 1000
        if entry[0] == "core":
            ctx.items.append(_Item(pos, end, words, family=entry[1], op=entry[2]))
        else:
            ctx.items.append(_Item(pos, end, words, step=entry[1], formula=True,
                                   pre=core_at is not None and i < core_at))
    ctx.note("ops", f"{words!r} -> " + ", ".join(e[2] if e[0] == "core" else pointwise.describe_chain([e[1]])
                                               for e in entries))


class _Walker:
    """Turns a formula tree into entries ("step", dict) / ("core", family, op), input first."""

    def __init__(self, main: str, ctx: _Ctx):
        self.main, self.ctx = main, ctx

    def fail(self, node, why: str):
        raise _Fail(f"in the formula, {_show(node)}: {why}")

    def has_input(self, node) -> bool:
        if node == ("name", self.main) or (node[0] == "bin" and node[1] == "@"):
            return True
        if node[0] == "call" and node[1] == "linear":
            return True
        return any(self.has_input(c) for c in _children(node))

    def walk(self, node) -> list:
        kind = node[0]
        if node == ("name", self.main):
            return []
        if kind == "bin" and node[1] == "@":
            return [self.matmul(node[2], node[3])]
        if kind == "neg":
            return self.walk(node[1]) + [("step", {"op": "neg"})]
        if kind == "bin":
            return self.binary(node)
        if kind == "call":
            return self.call(node)
        if kind == "T":
            self.fail(node, "a transpose only fits the weight of a matmul (x @ W^T)")
        self.fail(node, "this does not read the input tensor")

    def matmul(self, a, b) -> tuple:
        if a[0] != "name":
            self.fail(a, "the left operand of @ must be a plain tensor (no ops before a matmul)")
        if b[0] == "T" and b[1][0] == "name":
            self.ctx.flags.add("nk")
        elif b[0] != "name":
            self.fail(b, "the right operand of @ must be a tensor or its transpose")
        return ("core", "matmul", "matmul")

    def binary(self, node) -> list:
        _, op, left, right = node
        in_left, in_right = self.has_input(left), self.has_input(right)
        if in_left and in_right:
            return self.self_product(node)
        inner, other = (left, right) if in_left else (right, left)
        chain = self.walk(inner)
        value = _const(other)
        if op == "+":
            return chain + [self.plus(other, value)]
        if op == "-":
            if in_left:
                step = {"op": "shift", "value": -value} if value is not None else self.operand(other, "sub")
                return chain + [("step", step)]
            return chain + [("step", {"op": "neg"}), self.plus(other, value)]
        if op == "*":
            step = {"op": "scale", "value": value} if value is not None else self.operand(other, "mul")
            return chain + [("step", step)]
        if op == "/" and in_left and value:
            return chain + [("step", {"op": "scale", "value": 1.0 / value})]
        if op in ("**", "^") and in_left and value == 2:
            return chain + [("step", {"op": "square"})]
        self.fail(node, "the pointwise vocabulary has no op for this (no division by a tensor, no powers but 2)")

    def plus(self, other, value) -> tuple:
        if value is not None:
            return ("step", {"op": "shift", "value": value})
        name = self.operand_name(other)
        op = "bias" if name in _BIAS_NAMES else "residual" if name in _RESIDUAL_NAMES else "add"
        return ("step", {"op": op})

    def operand(self, other, op: str) -> dict:
        self.operand_name(other)
        return {"op": op}

    def operand_name(self, other) -> str:
        if other[0] != "name":
            self.fail(other, "a second operand must be a plain tensor name")
        return other[1]

    def self_product(self, node) -> list:
        """x * x -> square, x * sigmoid(x) -> silu; other uses of the input twice have no op."""
        _, op, left, right = node
        if op == "*":
            if left == right:
                return self.walk(left) + [("step", {"op": "square"})]
            for a, b in ((left, right), (right, left)):
                if b[0] == "call" and b[1] == "sigmoid" and b[2] == [a] and not b[3]:
                    return self.walk(a) + [("step", {"op": "silu"})]
        self.fail(node, "it uses the input twice in a way the pointwise vocabulary has no op for")

    def call(self, node) -> list:
        _, name, args, kwargs = node
        if name in _UNSUPPORTED_FUNCS:
            self.fail(node, f"{name} is not in the pointwise vocabulary ({_vocabulary()})")
        if name == "linear":   # F.linear(x, w[, b]) = x @ w^T (+ b)
            self.ctx.flags.add("nk")
            return [("core", "matmul", "matmul")] + ([("step", {"op": "bias"})] if len(args) > 2 else [])
        if not args:
            self.fail(node, "it has no input")
        inner = self.walk(args[0])
        if name in _UNARY_FUNCS:
            approx = kwargs.get("approximate")
            tanh = name == "gelu" and approx is not None and approx[1] == "tanh"
            return inner + [("step", {"op": "gelu_tanh" if tanh else _UNARY_FUNCS[name]})]
        if name in _CORE_FUNCS or (name in ("max", "min") and len(args) == 1):
            return inner + [self.core(node)]
        return inner + [("step", s) for s in self.bounded(node)]

    def core(self, node) -> tuple:
        _, name, args, kwargs = node
        family, op = _CORE_FUNCS.get(name, ("reduction", name))
        dim = kwargs.get("dim", kwargs.get("axis"))
        if dim is None and len(args) > 1 and family != "norm":
            dim = args[1]
        if dim is not None:
            value = _const(dim)
            if value is None or value != int(value):
                self.fail(node, "the dim must be a number")
            self.ctx.reduce_dim = int(value)
        if "eps" in kwargs:
            eps = _const(kwargs["eps"])
            if eps is None:
                self.fail(node, "eps must be a number")
            self.ctx.value("eps", eps)
        return ("core", family, op)

    def bounded(self, node) -> list[dict]:
        """max(x, 0), clamp(x, 0, 6), leaky_relu(x, 0.2), relu6(x)."""
        _, name, args, kwargs = node
        rest = [_const(a) for a in args[1:]]
        if name == "relu6":
            return [{"op": "clamp_min", "value": 0.0}, {"op": "clamp_max", "value": 6.0}]
        if name == "leaky_relu":
            given = kwargs.get("negative_slope", args[1] if len(args) > 1 else ("num", DEFAULT_LEAKY_SLOPE))
            slope = _const(given)
            if slope is None:
                self.fail(node, "the slope must be a number")
            return [{"op": "leaky_relu", "value": slope}]
        if name in _BOUND_FUNCS and len(args) == 2:
            if rest[0] is not None:
                return [{"op": _BOUND_FUNCS[name], "value": rest[0]}]
            self.operand_name(args[1])
            return [{"op": "maximum" if _BOUND_FUNCS[name] == "clamp_min" else "minimum"}]
        if name in ("clamp", "clip", "clamp_min", "clamp_max"):
            # clamp(x, lo, hi) / clamp(x, min=lo, max=hi) / clamp_max(x, hi)
            positional = ([None] if name == "clamp_max" else []) + args[1:]
            lo = kwargs.get("min", positional[0] if positional else None)
            hi = kwargs.get("max", positional[1] if len(positional) > 1 else None)
            bounds = (("clamp_min", lo), ("clamp_max", hi))
            steps = [{"op": op, "value": _const(b)} for op, b in bounds if b is not None]
            if steps and all(s["value"] is not None for s in steps):
                return steps
        self.fail(node, "I cannot map this call to the pointwise vocabulary")


def _children(node) -> list:
    if node[0] == "call":
        return node[2] + list(node[3].values())
    return [c for c in node[1:] if isinstance(c, tuple)]


def _const(node) -> float | None:
    """The value of a formula part without tensors (1/8, 1/sqrt(128), 2**-3), else None."""
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "neg":
        v = _const(node[1])
        return None if v is None else -v
    if kind == "call" and node[1] == "sqrt" and len(node[2]) == 1:
        v = _const(node[2][0])
        return math.sqrt(v) if v is not None and v >= 0 else None
    if kind == "bin" and node[1] != "@":
        a, b = _const(node[2]), _const(node[3])
        if a is None or b is None:
            return None
        try:
            v = {"+": a + b, "-": a - b, "*": a * b}.get(node[1])
            if v is None:
                v = a / b if node[1] == "/" else float(a ** b)
        except (ZeroDivisionError, OverflowError, TypeError):
            raise _Fail(f"the number {_show(node)} cannot be computed.") from None
        if isinstance(v, complex) or not math.isfinite(v):
            raise _Fail(f"the number {_show(node)} cannot be computed.")
        return v
    return None


def _show(node) -> str:
    kind = node[0]
    if kind == "num":
        return f"{node[1]:g}"
    if kind in ("name", "str"):
        return node[1]
    if kind == "neg":
        return "-" + _show(node[1])
    if kind == "T":
        return _show(node[1]) + "^T"
    if kind == "bin":
        return f"({_show(node[2])} {node[1]} {_show(node[3])})"
    args = [_show(a) for a in node[2]] + [f"{k}={_show(v)}" for k, v in node[3].items()]
    return f"{node[1]}({', '.join(args)})"


# -- phase 5: op words ----------------------------------------------------------------------

_UNSUPPORTED = [  # (pattern, what it is); checked before anything could read part of it
    (r"\bconv\w*|\bconvolution\w*", "convolution"),
    (r"\b(?:flash[\s_-]*)?attention\b|\bsdpa\b|\bmulti[\s_-]*head\b", "attention"),
    (r"\bbatch[\s_-]*norm\w*|\bbn\b", "batch norm"),
    (r"\bgroup[\s_-]*norm\w*|\binstance[\s_-]*norm\w*|\bweight[\s_-]*norm\w*", "group/instance/weight norm"),
    (r"\bl[12][\s_-]*norm\w*|\bfrobenius\b|\bvector\s+norm\b", "vector norms (L1/L2)"),
    (r"\bcum[\s_-]*(?:sum|prod)\w*|\bcumulative\b|\bprefix[\s_-]*sums?\b|\bscan\b", "cumulative sums / scans"),
    (r"\bsort\w*|\btop[\s_-]?k\b", "sorting / top-k"),
    (r"\bembedding\w*|\bgather\w*|\bscatter\w*|\bindex[\s_-]*select\w*", "gather / scatter / embedding"),
    (r"\b\w*pool\w*", "pooling"),
    (r"\bfft\b|\bfourier\b", "FFT"),
    (r"\bdropout\b", "dropout"),
    (r"\bcross[\s_-]*entropy\b|\bloss\b|\bnll\b|\bmse\b|\bmean[\s_-]+(?:squared|absolute)[\s_-]+error\b",
     "loss functions"),
    (r"\blog[\s_-]*sum[\s_-]*exp\b", "logsumexp"),
    (r"\btranspos\w*|\bpermut\w*|\breshap\w*|\bconcat\w*", "layout ops (transpose, permute, reshape, concat)"),
    (r"\beinsum\b", "einsum"),
    (r"\b(?:de)?quanti[sz]\w*", "quantization"),
    (r"\bvariance\b|\bstd\b|\bstandard\s+deviation\b", "variance / standard deviation"),
]
_UNSUPPORTED_STEPS = (r"\b(?:sqrt|rsqrt|square\s+root|log|ln|log1p|log2|sin|sine|cos|cosine|softplus|mish|elu"
                      r"|selu|celu|hard[\s_-]*(?:swish|sigmoid|tanh)|erf|reciprocal|floor|ceil)\b"
                      r"|\bdivi\w*\s+(?:\w+\s+){0,2}?(?:by\s+)?(?:two|2|another|a\s+second|the\s+other|y\b)"
                      r"|\b(?:element|point)[\s_-]*wise\s+divi\w*")
_LAYOUT_NK = (r"\btranspos\w*\s+(?:the\s+)?(?:weight|w|b|rhs|second\s+(?:matrix|operand))\b"
              r"|\b(?:weight|w|b|rhs)\s+(?:is\s+|stored\s+)?transposed\b|\bnk\s+layout\b"
              r"|\bb_layout\s*=?\s*['\"]?nk['\"]?")
_MATMUL_WORDS = r"(?:matmul|mat[\s_-]mul|gemm|[shd]gemm|mm|matrix[\s_-]*(?:multipl\w*|products?|mult))"
_CORES = [  # (pattern, family, op); specific before general ("log softmax" is not also "softmax")
    (r"\blog[\s_-]*soft[\s_-]?max\b|\blogsoftmax\b", "softmax", "log_softmax"),
    (r"\bsoft[\s_-]?max\b", "softmax", "softmax"),
    (r"\brms[\s_-]*norm\w*|\broot[\s_-]+mean[\s_-]+squared?[\s_-]+norm\w*", "norm", "rmsnorm"),
    (r"\blayer[\s_-]*norm\w*", "norm", "layernorm"),
    (r"\bnormali[sz]\w*|\bnorms?\b", "norm", None),
    (rf"\b(?:bmm|batch(?:ed)?[\s_-]*{_MATMUL_WORDS})\b", "matmul", "bmm"),
    (rf"\b{_MATMUL_WORDS}\b", "matmul", "matmul"),
    (r"\bnn\.linear\b|\blinear(?:[\s_-]+(?:layer|projection|transform\w*))?\b|\bdense[\s_-]+layer\b"
     r"|\bfully[\s_-]*connected(?:[\s_-]+layer)?\b", "matmul", "linear"),
    (r"\barg[\s_-]?max\b", "reduction", "argmax"),
    (r"\barg[\s_-]?min\b", "reduction", "argmin"),
    (r"\b(?:reduce[\s_-]*)?(?:sum|sums|summation)\b", "reduction", "sum"),
    (r"\b(?:reduce[\s_-]*)?(?:mean|means|average|avg)\b", "reduction", "mean"),
    (r"\b(?:reduce[\s_-]*)?(?:max|maximum|maxima|amax)\b", "reduction", "max"),
    (r"\b(?:reduce[\s_-]*)?(?:min|minimum|minima|amin)\b", "reduction", "min"),
    (r"\breduc\w*", "reduction", None),
]
_VERB = r"(?:(?:add|adds|adding|apply|applies|applying|with)\s+(?:an?\s+|the\s+)?)?"
_NUMERIC_STEPS = [  # (pattern with group v, step op, how the number becomes the value)
    (rf"\bscal(?:e|ing)[\s_-]*factor\s*(?:of|=|:|is)?\s*(?P<v>{NUM})", "scale", None),
    (rf"\b(?:scale[sd]?|multipl(?:y|ied|ies)|times|mul|alpha)\s+(?:(?:it|everything|the\s+(?:result|output|input"
     rf"|values?|logits|scores))\s+)?(?:by\s+|with\s+|of\s+|=\s*|:\s*)?(?:a\s+(?:factor|constant)\s+(?:of\s+)?)?"
     rf"(?P<v>{NUM})", "scale", None),
    (rf"\balpha\s*=\s*(?P<v>{NUM})", "scale", None),
    (rf"\b(?:divide[sd]?|divided)\s+(?:(?:it|everything|the\s+\w+)\s+)?by\s+(?P<v>{NUM})", "scale", "inverse"),
    (rf"\b(?:add(?:s|ing|ed)?|plus|shift(?:ed|s)?(?:\s+by)?|offset(?:\s+by)?)\s+(?:a\s+constant\s+(?:of\s+)?)?"
     rf"(?P<v>{NUM})", "shift", None),
    (rf"\b(?:subtract(?:s|ing|ed)?|minus)\s+(?:a\s+constant\s+(?:of\s+)?)?(?P<v>{NUM})", "shift", "negate"),
    (rf"{_VERB}\bleaky[\s_-]*relu\b(?:\s*\(?\s*(?:with\s+)?(?:an?\s+|the\s+)?(?:negative[\s_-]*)?(?:slope|alpha)?"
     rf"\s*(?:of|=|:)?\s*(?P<v>{NUM})\s*\)?)?", "leaky_relu", None),
]
_VALUE_WORDS = [  # family parameters given in words
    (rf"\b(?:eps|epsilon)\s*(?:of|=|:|is)?\s*(?P<v>{NUM})", "eps"),
    (rf"\btemperature\s*(?:of|=|:|is)?\s*(?P<v>{NUM})", "temperature"),
]
_PAIR = (r"(?:(?:the\s+)?(?:two|2|a\s+pair\s+of|both)\s+(?:[\w-]+\s+)?"
         r"(?:tensors|matrices|arrays|inputs|operands)\b)")
_OTHER = (r"(?:(?:(?:an?|the)\s+)?(?:another|other|second|2nd)\s+(?:[\w-]+\s+)?"
          r"(?:tensor|input|matrix|array|operand)\b|\by\b)")
_BINARY_VERBS = {
    "add": r"add|adds|adding|addition|sum|plus",
    "sub": r"subtract|subtracts|subtracting|subtraction|sub|minus|difference",
    "mul": r"hadamard\s+product|multiply|multiplies|multiplying|multiplied|multiplication|mul|times|product",
    "maximum": r"max|maximum",
    "minimum": r"min|minimum",
}


def _binary_pattern(verbs: str) -> str:
    """The ways a binary op with a second full tensor is said: "add two tensors", "multiply by
    another tensor", "max of x and y", "x times y", "elementwise product"."""
    v = rf"\b(?:{verbs})\b"
    return "|".join([
        rf"{v}(?:\s+(?:of|up))?\s+{_PAIR}",
        rf"{v}(?:\s+(?:it|x|by|with|to|and|from)){{0,2}}\s+{_OTHER}",
        rf"{v}\s+(?:of\s+)?x\s+(?:and|with|by|to|from)\s+y\b",
        rf"\bx\s+(?:{verbs})\s+(?:by\s+)?y\b",
        rf"\b(?:element|point)[\s_-]*wise\s+(?:{verbs})\b",
    ])


_OPERAND_STEPS = [
    (rf"(?:\b(?:add|adds|adding|plus|with)\s+(?:an?\s+|the\s+)?)?\b(?:learn\w+\s+)?bias(?:es)?"
     rf"(?:[\s_-]*add(?:ition)?)?\b", "bias"),
    (r"(?:\b(?:add|adds|adding|plus|with)\s+(?:an?\s+|the\s+)?)?\b(?:residual|skip[\s_-]*connection|shortcut)"
     r"(?:\s+(?:add|connection|tensor|input|stream))?\b", "residual"),
    (r"\bhadamard(?:\s+product)?\b", "mul"),
]
_UNARY_WORDS = [  # specific before general: "gelu with tanh approximation" is neither gelu nor tanh
    (r"relu[\s_-]?6", [{"op": "clamp_min", "value": 0.0}, {"op": "clamp_max", "value": 6.0}]),
    (r"gelu[\s_-]*(?:\(\s*)?(?:(?:with|using)\s+)?(?:the\s+|a\s+)?tanh(?:[\s_-]*approx\w*)?(?:\s*\))?"
     r"|(?:tanh|approx\w*|fast)[\s_-]+(?:approximat\w*\s+)?gelu|gelu[\s_-]+approx\w*", [{"op": "gelu_tanh"}]),
    (r"gelu(?:\s*\(?\s*(?:exact|erf)\s*\)?)?", [{"op": "gelu"}]),
    (r"silu|swish", [{"op": "silu"}]),
    (r"sigmoid|logistic", [{"op": "sigmoid"}]),
    (r"tanh", [{"op": "tanh"}]),
    (r"exp|exponential|exponentiate", [{"op": "exp"}]),
    (r"abs|absolute(?:\s+values?)?", [{"op": "abs"}]),
    (r"neg|negate|negated|negation", [{"op": "neg"}]),
    (r"square|squares|squared|squaring", [{"op": "square"}]),
    (r"relu", [{"op": "relu"}]),
]
# "fused add + rmsnorm": the residual add before a norm (read before the norm words are taken).
_ADD_NORM = r"\badd\s*(?:\+|&|and|-)\s*(?=(?:layer|rms)[\s_-]*norm)"
_ELEMENTWISE_WORDS = r"\b(?:element|point)[\s_-]*wise\b|\bhadamard\b"
_MULTIPLY = r"\b(?:multipl\w*|times|product(?:\s+of)?)\b(?!\s*(?:by\s+|with\s+)?[-+]?[\d.])"


def _read_words(ctx: _Ctx) -> None:
    for m in ctx.take(_LAYOUT_NK):
        ctx.flags.add("nk")
        ctx.note("ops", f"{m.group(0).strip()!r} -> weight stored [N, K]")
    for pattern, what in _UNSUPPORTED:
        for m in ctx.take(pattern):
            ctx.note("unsupported", what)
            raise _Fail(f"{what[0].upper() + what[1:]} ('{m.group(0).strip()}') is not in the catalog yet, "
                        "so I cannot write it.")
    _read_matrix_product(ctx)
    for op, verbs in _BINARY_VERBS.items():
        for m in ctx.take(_binary_pattern(verbs)):
            ctx.add_steps(m, [{"op": op}])
    for m in ctx.take(r"\bscaled\s+(?=(?:log[\s_-]*)?soft[\s_-]?max)"):
        ctx.flags.add("scaled_softmax")
    for m in ctx.take(_ADD_NORM):
        ctx.add_steps(m, [{"op": "residual"}])
    for pattern, family, op in _CORES:
        for m in ctx.take(pattern):
            if op == "linear":   # a linear layer is a matmul with the weight stored [N, K]
                ctx.flags.add("nk")
            ctx.add_core(m, family, "matmul" if op == "linear" else op)
    _read_numeric_steps(ctx)
    for m in ctx.take(_UNSUPPORTED_STEPS):
        ctx.note("unsupported", m.group(0).strip())
        raise _Fail(f"'{m.group(0).strip()}' is not in the pointwise vocabulary; the ops I can chain are: "
                    f"{_vocabulary()}.")
    for pattern, op in _OPERAND_STEPS:
        for m in ctx.take(pattern):
            if op in ("bias", "residual") and f"no_{op}" in ctx.flags:
                raise _Fail(f"the request both asks for a {op} and says there is none.")
            ctx.add_steps(m, [{"op": op}])
    for words, steps in _UNARY_WORDS:
        for m in ctx.take(rf"{_VERB}\b(?:{words})\b(?:\s+activation)?"):
            ctx.add_steps(m, [dict(s) for s in steps])
    for m in ctx.take(_ELEMENTWISE_WORDS):   # a chain needs no more than its steps
        ctx.note("context", m.group(0).strip())


def _read_matrix_product(ctx: _Ctx) -> None:
    """"a 1024x512 matrix times a 512x256 matrix", "multiply two 4096x4096 matrices": a matmul,
    unless the request says elementwise (then it is the mul step)."""
    if _rx(_ELEMENTWISE_WORDS).search(ctx.s) or not _rx(r"\bmatri(?:x|ces)\b").search(ctx.s):
        return
    for m in ctx.take(_MULTIPLY):
        ctx.add_core(m, "matmul", "matmul")


def _read_numeric_steps(ctx: _Ctx) -> None:
    for pattern, op, how in _NUMERIC_STEPS:
        for m in ctx.take(pattern):
            if m.group("v") is None:   # "leaky relu" with no slope
                value = DEFAULT_LEAKY_SLOPE
                ctx.assume(f"no leaky relu slope given: using PyTorch's default {DEFAULT_LEAKY_SLOPE}")
            else:
                value = _number(m.group("v"))
            if how == "inverse":
                if value == 0:
                    raise _Fail(f"'{m.group(0).strip()}' divides by zero.")
                value = 1.0 / value
            elif how == "negate":
                value = -value
            ctx.add_steps(m, [{"op": op, "value": value}])
    for pattern, key in _VALUE_WORDS:
        for m in ctx.take(pattern):
            ctx.value(key, _number(m.group("v")))


# -- phase 6: which axis a row op works along -----------------------------------------------

_LAST_AXIS = (r"\b(?:row[\s_-]*wise|per[\s_-]+row|(?:each|every)\s+row"
              r"|(?:over|along|across|for)\s+(?:the\s+|each\s+)?rows"
              r"|(?:over|along|across)\s+(?:the\s+)?(?:last|final|inner(?:most)?)\s+(?:dim\w*|axis))\b")
_OTHER_AXES = [  # (pattern, how the message names that axis); all refused by _check_axis
    (r"\b(?:column[\s_-]*wise|per[\s_-]+column|(?:each|every)\s+column|(?:over|along|across|down)\s+"
     r"(?:the\s+)?columns?|(?:over|along|across)\s+(?:the\s+)?(?:first|leading|outer)\s+(?:dim\w*|axis))\b",
     "the columns"),
    (r"\b(?:last|final|first)\s+(?:two|three|four|[2-9])\s+(?:dim\w*|axes)\b", "several dims"),
    (r"\b(?:all\s+(?:the\s+)?(?:elements|dims|dimensions|axes|values)"
     r"|(?:the\s+)?(?:whole|entire)\s+(?:tensor|matrix|array)"
     r"|global(?:ly)?|full\s+reduction|to\s+a\s+(?:single\s+)?scalar)\b", "all elements"),
]
_AXIS_NUMBER = r"\b(?:dim|axis|dimension)\s*(?:=|:)?\s*(?P<d>-?\d+)(?!\w|\.\d)"


_ROW_OP = r"\brows?(?=[\s_-]+(?:sums?|means?|max\w*|min\w*|arg[\s_-]?(?:max|min)|averages?|reduc\w*)\b)"


def _read_axis(ctx: _Ctx) -> None:
    for m in _rx(_ROW_OP).finditer(ctx.norm):   # "row sum": the op words are already taken
        if ctx.s[m.start():m.end()] == m.group(0):
            ctx.s = ctx.s[:m.start()] + " " * (m.end() - m.start()) + ctx.s[m.end():]
            ctx.reduce_dim = "last"
    for m in ctx.take(_LAST_AXIS):
        ctx.reduce_dim = ctx.reduce_dim if ctx.reduce_dim is not None else "last"
    for pattern, where in _OTHER_AXES:
        if ctx.take(pattern):
            ctx.reduce_dim = where
    for m in ctx.take(_AXIS_NUMBER):
        ctx.reduce_dim = int(m.group("d"))
    if ctx.reduce_dim is not None:
        ctx.understood["axis"] = ctx.reduce_dim


def _check_axis(ctx: _Ctx, ndim: int, what: str) -> None:
    """Row ops work along the last dim; anything else is refused, never silently transposed."""
    d = ctx.reduce_dim
    if d is None or d == "last":
        return
    if isinstance(d, int) and -ndim <= d < ndim and d % ndim == ndim - 1:
        return
    where = d if isinstance(d, str) else f"dim {d}"
    hint = "" if d == "all elements" else " Transpose the input first, or ask for the op over the rows."
    raise _Fail(f"{what} over {where} of a {ndim}-d tensor is not supported yet: row ops work along the "
                f"last dim only (each row, over its columns).{hint}")


# -- phase 7: nothing may be left over --------------------------------------------------------

_LEFT_NUMBER = r"(?<![a-z_\d.])[-+]?\d[\w.]*"   # any digit run not inside a name (h100)
_LEFT_PARAM = r"\b(?:clamp\w*|clip\w*|eps|epsilon|temperature|leaky|slope|[bmnk]\s*=)"
_LEFT_VERB = r"\b(?:add|adds|subtract\w*|multipl\w*|divide\w*|plus|minus|times|scale|scaled|scales)\b"


def _check_leftovers(ctx: _Ctx) -> None:
    numbers = _rx(_LEFT_NUMBER).findall(ctx.s)
    if numbers:
        raise _Fail(f"I could not tell what {', '.join(numbers[:3])} means here. Give sizes as a shape "
                    "(4096x8192, [32, 128, 4096], '8192 rows of width 4096', M=.. N=.. K=..) and values "
                    "after their op ('scale by 0.5', 'eps 1e-5').")
    params = _rx(_LEFT_PARAM).findall(ctx.s)
    if params:
        raise _Fail(f"I saw '{params[0].strip()}' but no value for it: say e.g. 'eps 1e-5', 'temperature 2', "
                    "'clamp to [0, 6]', 'leaky relu with slope 0.1', 'M=4096'.")
    verbs = _rx(_LEFT_VERB).findall(ctx.s)
    if verbs:
        raise _Fail(f"I saw '{verbs[0]}' but not what it applies to: say e.g. 'add a bias', 'add a "
                    "residual', 'add another tensor', 'scale by 0.5'.")


# Words a clause may hold besides its op: articles, verbs of doing, names of the data.
_FILLER = frozenset("""a an the it its on to in into of for over along across with and by is are be that this
    we also then finally next apply applies applying applied do does compute computes computing take takes taking
    calculate calculates perform performs run runs fused fuse fusing kernel op operation same result results output
    outputs input inputs tensor tensors matrix matrices array arrays value values element elements each every row
    rows all one single elementwise pointwise wise per x y""".split())
_OP_NAMES = ("softmax", "log_softmax", "logsoftmax", "layernorm", "rmsnorm", "normalize", "matmul", "gemm", "bmm",
             "linear", "sum", "mean", "average", "max", "min", "argmax", "argmin", "reduce", "relu", "gelu", "silu",
             "swish", "sigmoid", "tanh", "exp", "abs", "negate", "square", "scale", "shift", "clamp", "leaky_relu",
             "bias", "residual", "add", "subtract", "multiply", "maximum", "minimum")


def _unread_words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z][a-z_]*", text) if w not in _FILLER]


def _did_you_mean(words: list[str]) -> str:
    for w in words:
        close = difflib.get_close_matches(w, _OP_NAMES, n=1, cutoff=0.75)
        if close and close[0] != w:
            return f" Did you mean '{close[0]}' for '{w}'?"
    return ""


def _check_clauses(ctx: _Ctx) -> None:
    """"relu then sofmax", "gelu then round": a clause after "then" / "after" in which no op was
    read holds a word outside the vocabulary; dropping it would write a kernel nobody asked for."""
    bounds = sorted(m.start() for m in _rx(_BOUNDARY + "|" + _AFTER).finditer(ctx.norm))
    for mark in _rx(_SEQ + "|" + _AFTER).finditer(ctx.norm):
        end = next((b for b in bounds if b >= mark.end()), len(ctx.norm))
        if any(mark.end() <= it.pos < end for it in ctx.items):
            continue
        words = _unread_words(ctx.s[mark.end():end])
        if words:
            raise _Fail(f"I could not read '{' '.join(words)}' (after '{mark.group(0).strip()}'): it is not an op "
                        f"I know, and I do not drop words silently.{_did_you_mean(words)}")


def _check_tensor_count(ctx: _Ctx, spec: KernelSpec) -> None:
    """"sigmoid of two 4096x4096 tensors": two tensors named, but the ops read only one."""
    if spec.family == "matmul" or not ("pair" in ctx.flags or _rx(_PAIR).search(ctx.norm)):
        return
    steps = [s for k in ("chain", "prologue", "epilogue") for s in spec.params.get(k, [])]
    if not any(pointwise.operand_kind(s) == "full" for s in steps):
        raise _Fail(f"the request names two tensors, but the ops I read ({', '.join(ctx.understood.get('ops', []))}) "
                    "take only one; say how the second one enters, e.g. 'x - y', 'multiply by another tensor', "
                    "'relu(x + y)'.")


# -- choosing the op --------------------------------------------------------------------------

def _decide(ctx: _Ctx) -> tuple[str, str]:
    cores = [it for it in ctx.items if it.is_core]
    if not cores:
        if any(not it.is_core for it in ctx.items):
            return "elementwise", "chain"
        raise _Fail("I found no kernel op in this request." + _did_you_mean(_unread_words(ctx.s)))
    families = sorted({c.family for c in cores})
    if len(families) > 1:
        named = ", ".join(sorted({f"'{c.words}' ({c.family})" for c in cores}))
        raise _Fail(f"the request names ops of different kinds: {named}. I write one kernel per request; "
                    "ask for them one at a time.")
    family = families[0]
    ops = {c.op for c in cores if c.op}
    if family == "matmul":
        return family, "bmm" if "bmm" in ops else "matmul"
    if not ops:
        raise _Fail(f"which {family}? I can write: {', '.join(FAMILY_OPS[family])}.")
    if len(ops) > 1:
        raise _Fail(f"the request names {' and '.join(sorted(ops))}; one kernel computes one of them.")
    return family, ops.pop()


def _ordered(ctx: _Ctx) -> list[_Item]:
    """Items in the order they apply: text order, except that "A after B" puts B first.
    Clauses are cut at "then", commas, ...; a run of "after" clauses is reversed."""
    marks = sorted([(m.start(), "after") for m in _rx(_AFTER).finditer(ctx.norm)]
                   + [(m.start(), "seq") for m in _rx(_BOUNDARY).finditer(ctx.norm)])
    clauses: list[tuple[str, list[_Item]]] = [("seq", [])]
    items = sorted(ctx.items, key=lambda it: it.pos)
    k = 0
    for item in items:
        while k < len(marks) and marks[k][0] <= item.pos:
            if clauses[-1][1] or marks[k][1] == "after":
                clauses.append((marks[k][1], []))
            k += 1
        clauses[-1][1].append(item)
    out, run = [], []
    for kind, clause in clauses:
        if kind != "after" and run:
            out.extend(it for c in reversed(run) for it in c)
            run = []
        run.append(clause)
    out.extend(it for c in reversed(run) for it in c)
    return out


def _around_core(ctx: _Ctx) -> tuple[_Item, list[_Item], list[_Item]]:
    """The core item, the steps applied before it and the steps applied after it."""
    order = _ordered(ctx)
    core_at = next(i for i, it in enumerate(order) if it.is_core)
    steps = [(i, it) for i, it in enumerate(order) if not it.is_core]
    pre = [it for i, it in steps if i < core_at or it.pre]
    post = [it for i, it in steps if i > core_at and not it.pre]
    return order[core_at], pre, post


def _binds_to_input(ctx: _Ctx, core: _Item, step: _Item) -> bool:
    """"layernorm of x plus a residual", "sum of squares": a step said right after the core,
    with no "then"/"followed by" between, describes the core's input."""
    if step.formula:
        return False
    return not _rx(_SEQ).search(ctx.norm[core.end:int(step.pos)])


# -- sizes for each family --------------------------------------------------------------------

def _use(ctx: _Ctx, *keys: str) -> None:
    ctx.flags.update(f"used_{k}" for k in keys)


def _check_sizes_used(ctx: _Ctx, family: str) -> None:
    unused = [k for k in ctx.sizes if f"used_{k}" not in ctx.flags]
    if unused:
        found = ", ".join(f"{_SIZE_NAMES[k]} {ctx.sizes[k]}" for k in unused)
        raise _Fail(f"I found {found}, which a {family} kernel has no use for.")


def _row_words(ctx: _Ctx) -> int | None:
    """Rows from words: "8192 rows", or batch x sequence length."""
    parts = [ctx.sizes[k] for k in ("rows", "batch", "seq") if k in ctx.sizes]
    _use(ctx, "rows", "batch", "seq")
    if len(parts) > 1:
        ctx.note("context", "rows = " + " x ".join(map(str, parts)))
    return math.prod(parts) if parts else None


def _one_shape(ctx: _Ctx) -> list[int] | None:
    """The shape of a one-tensor op; a second shape may only repeat it, or be the [N] of a bias
    or of a norm's weight."""
    if not ctx.shapes:
        return None
    main = max(ctx.shapes, key=len)
    vector_ok = _has_vector(ctx) or ctx.understood.get("family") == "norm"
    for s in ctx.shapes:
        if s != main and not (vector_ok and s == main[-1:]):
            raise _Fail(f"I found several shapes ({', '.join(map(_x, ctx.shapes))}); this kernel works on "
                        "one shape (only a bias [N] may accompany an [..., N] tensor).")
    return main


def _has_vector(ctx: _Ctx) -> bool:
    return any(it.step and it.step["op"] == "bias" for it in ctx.items)


def _row_dims(ctx: _Ctx) -> tuple[int, int, list[int]]:
    """(M, N, shape) of a row op or elementwise chain: leading dims multiply into M."""
    shape = _one_shape(ctx)
    rows, cols = _row_words(ctx), ctx.sizes.get("cols")
    rows = _agree(ctx, "M", rows, "the number of rows")
    cols = _agree(ctx, "N", cols, "the row width")
    _use(ctx, "cols", "M", "N")
    if shape:
        m, n = math.prod(shape[:-1]), shape[-1]
        for given, got, what in ((rows, m, "rows"), (cols, n, "width")):
            if given is not None and given != got:
                raise _Fail(f"the shape {_x(shape)} has {got} {what}, but the request also says {given}.")
        if len(shape) > 2:
            ctx.note("context", f"leading dims {'x'.join(map(str, shape[:-1]))} flattened into M={m} rows")
        return m, n, shape
    if rows is None and cols is None:
        ctx.assume(f"no shape given: using {DEFAULT_SIZE}x{DEFAULT_SIZE}")
    elif rows is None:
        ctx.assume(f"no row count given: using M={DEFAULT_SIZE} rows")
    elif cols is None:
        ctx.assume(f"no row width given: using N={DEFAULT_SIZE} columns")
    m, n = rows or DEFAULT_SIZE, cols or DEFAULT_SIZE
    return m, n, [m, n]


def _agree(ctx: _Ctx, named: str, value: int | None, what: str) -> int | None:
    other = ctx.sizes.get(named)
    if value is not None and other is not None and value != other:
        raise _Fail(f"{what} is given twice: {named}={other} and {value}.")
    return value if value is not None else other


def _dtype(ctx: _Ctx) -> str:
    if ctx.dtype is None:
        ctx.assume("no dtype given: using float32")
        return "float32"
    return ctx.dtype


def _values(ctx: _Ctx, family: str, *allowed: str) -> dict[str, float]:
    extra = sorted(set(ctx.values) - set(allowed))
    if extra:
        owner = "layernorm/rmsnorm" if extra[0] == "eps" else "softmax"
        raise _Fail(f"{extra[0]} is not a parameter of a {family} kernel (it belongs to {owner}).")
    return {k: ctx.values[k] for k in allowed if k in ctx.values}


# -- the families -----------------------------------------------------------------------------

def _row_spec(ctx: _Ctx, family: str, op: str, params: dict) -> KernelSpec:
    m, n, shape = _row_dims(ctx)
    _check_axis(ctx, len(shape), op)
    return KernelSpec(family, op, {"M": m, "N": n}, _dtype(ctx), params)


def _steps(items: list[_Item]) -> list[dict]:
    return [dict(it.step) for it in items]


def _build_softmax(ctx: _Ctx, op: str) -> KernelSpec:
    core, pre, post = _around_core(ctx)
    values = _values(ctx, "softmax", "temperature")
    # "softmax of x scaled by 0.125": a scale said right after the softmax scales its input.
    bound = [it for it in post if it.step["op"] == "scale" and _binds_to_input(ctx, core, it)]
    post = [it for it in post if it not in bound]
    pre = pre + bound
    scales = [it.step["value"] for it in pre if it.step["op"] == "scale"]
    if "temperature" in values:
        if values["temperature"] == 0:
            raise _Fail("a temperature of 0 divides by zero.")
        scales.append(1.0 / values["temperature"])
    params: dict = {}
    if len(scales) > 1:
        raise _Fail(f"the request gives more than one scale ({', '.join(f'{v:g}' for v in scales)}); say one.")
    if scales and len(pre) == len(scales) - ("temperature" in values):
        params["scale"] = scales[0]           # "scaled softmax with scale 0.125", "softmax(x / 8)"
    elif pre:
        if "temperature" in values:
            raise _Fail("a temperature together with other ops before the softmax is ambiguous; write the "
                        "ops as a formula, e.g. 'softmax(relu(x) * 0.5)'.")
        params["prologue"] = _steps(pre)      # "softmax(relu(x) * 0.5)"
    if "scaled_softmax" in ctx.flags and "scale" not in params:
        raise _Fail("'scaled softmax' needs the scale, e.g. 'scaled softmax with scale 0.125'.")
    if post:
        params["epilogue"] = _steps(post)
    return _row_spec(ctx, "softmax", op, params)


def _build_reduction(ctx: _Ctx, op: str) -> KernelSpec:
    core, pre, post = _around_core(ctx)
    _values(ctx, "reduction")
    loose = [it for it in post if not _binds_to_input(ctx, core, it)]
    if loose:
        raise _Fail(f"a reduction kernel takes no ops after it yet ('{loose[0].words}' comes after the "
                    f"{op}); ops on its input are fine, e.g. 'sum of squares'.")
    chain = _steps(pre + post)
    if ctx.reduce_dim is None:
        ctx.assume(f"no axis given: {op} over the last dim (one result per row), not over all elements")
    return _row_spec(ctx, "reduction", op, {"prologue": chain} if chain else {})


def _build_norm(ctx: _Ctx, op: str) -> KernelSpec:
    core, pre, post = _around_core(ctx)
    params: dict = _values(ctx, "norm", "eps")
    # "layernorm of x plus a residual": an add right after the norm words is its input.
    bound = [it for it in post if it.step["op"] in ("residual", "add") and _binds_to_input(ctx, core, it)]
    prologue = _steps(pre + bound)
    epilogue = _steps([it for it in post if it not in bound])
    if "eps" in params and params["eps"] <= 0:
        raise _Fail(f"eps must be positive, got {params['eps']:g}.")
    if prologue:
        params["prologue"] = prologue
    if epilogue:
        params["epilogue"] = epilogue
    if "no_affine" in ctx.flags:
        params["affine"] = False
    if op == "layernorm" and "no_bias" in ctx.flags and "no_affine" not in ctx.flags:
        params["bias"] = False               # the weight stays: nn.LayerNorm(N, bias=False)
    if op == "rmsnorm" and "norm_bias" in ctx.flags:
        raise _Fail("there is no bias in rmsnorm, only a weight; for a bias added after it, say "
                    "'rmsnorm then add a bias'.")
    return _row_spec(ctx, "norm", op, params)


def _build_elementwise(ctx: _Ctx, op: str) -> KernelSpec:
    _values(ctx, "elementwise")
    chain = _steps(_ordered(ctx))
    m, n, shape = _row_dims(ctx)
    params: dict = {"chain": chain}
    if len(shape) != 2:
        params["shape"] = shape
    return KernelSpec("elementwise", "chain", {"M": m, "N": n}, _dtype(ctx), params)


def _build_matmul(ctx: _Ctx, op: str) -> KernelSpec:
    _values(ctx, "matmul")
    nk = "nk" in ctx.flags
    dims = _matmul_dims(ctx, op, nk)
    _use(ctx, "M", "N", "K", "B")
    params: dict = {}
    epilogue = _steps([it for it in _ordered(ctx) if not it.is_core])
    if epilogue:
        params["epilogue"] = epilogue
    if nk:
        params["b_layout"] = "nk"
    return KernelSpec("matmul", "bmm" if "B" in dims else "matmul", dims, _dtype(ctx), params)


def _matmul_dims(ctx: _Ctx, op: str, nk: bool) -> dict[str, int]:
    named = {k: ctx.sizes[k] for k in ("B", "M", "N", "K") if k in ctx.sizes}
    if named:
        if not {"M", "N", "K"} <= set(named):
            missing = ", ".join(k for k in "MNK" if k not in named)
            raise _Fail(f"the matmul sizes are incomplete: {missing} missing (give M, N and K).")
        if ctx.shapes:
            _same(_shape_dims(ctx, op, nk), named)
        return _with_batch(ctx, op, named)
    if "in_features" in ctx.sizes or "out_features" in ctx.sizes:
        return _linear_dims(ctx)
    if ctx.shapes:
        return _with_batch(ctx, op, _shape_dims(ctx, op, nk))
    _use(ctx, "rows", "batch", "seq", "cols")
    if ctx.sizes:
        raise _Fail("I could not get the matmul sizes from this; give both shapes ('4096x4096 by 4096x1024') "
                    "or M=.. N=.. K=..")
    default = dict(DEFAULT_BMM) if op == "bmm" else {"M": DEFAULT_SIZE, "N": DEFAULT_SIZE, "K": DEFAULT_SIZE}
    ctx.assume("no shape given: using " + ", ".join(f"{k}={v}" for k, v in default.items()))
    return default


def _same(from_shapes: dict, named: dict) -> None:
    for k, v in named.items():
        if k in from_shapes and from_shapes[k] != v:
            raise _Fail(f"the shapes give {k}={from_shapes[k]} but the request also says {k}={v}.")


def _with_batch(ctx: _Ctx, op: str, dims: dict) -> dict:
    """A bmm asked for in words takes its batch from "batch 32"; else a stated default."""
    if op != "bmm" or "B" in dims:
        return dims
    if "batch" in ctx.sizes:
        _use(ctx, "batch")
        return {"B": ctx.sizes["batch"], **dims}
    ctx.assume(f"no batch size given for the batched matmul: using B={DEFAULT_BMM['B']}")
    return {"B": DEFAULT_BMM["B"], **dims}


def _shape_dims(ctx: _Ctx, op: str, nk: bool) -> dict[str, int]:
    shapes = [s for s in ctx.shapes if len(s) > 1]
    vectors = [s for s in ctx.shapes if len(s) == 1]     # a bias [N]
    if not shapes:
        raise _Fail(f"a matmul needs its operand shapes; I found only {', '.join(map(_x, vectors))}.")
    if len(shapes) == 1:
        shapes = _single_matmul_shape(ctx, shapes[0])
    a, b = shapes[0], shapes[1]
    if len(a) < 2 or len(b) < 2 or len(b) > 3:
        raise _Fail(f"a matmul needs 2-d (or batched 3-d) operands; got {_x(a)} and {_x(b)}.")
    dims = _pair_dims(ctx, a, b, nk)
    if vectors and not _has_vector(ctx):
        raise _Fail(f"I found a vector of size {vectors[0][0]}: a matrix-vector product is not supported "
                    "yet (give it as a matrix, e.g. 4096x1), and there is no bias to give it to.")
    if any(v != [dims["N"]] for v in vectors):
        raise _Fail(f"a bias of size {vectors[0][0]} does not fit the matmul output width N={dims['N']}.")
    out = [*([dims["B"]] if "B" in dims else []), dims["M"], dims["N"]]
    for extra in shapes[2:]:
        if extra != out and extra != a[:-1] + [dims["N"]]:
            raise _Fail(f"I found a third shape {_x(extra)} that is not the result {_x(out)}; give the two "
                        "operand shapes.")
    return dims


def _single_matmul_shape(ctx: _Ctx, shape: list[int]) -> list[list[int]]:
    """One shape for a matmul: only a square one (or "two NxN matrices", "4096x4096x4096") says
    both operands."""
    if len(shape) == 3 and len(set(shape)) == 1:
        ctx.assume(f"{_x(shape)} read as M=N=K={shape[0]}")
        return [shape[:2], shape[:2]]
    if len(shape) == 2 and (shape[0] == shape[1] or "square" in ctx.flags):
        if shape[0] != shape[1]:
            raise _Fail(f"a 'square' matmul with the non-square shape {_x(shape)} is contradictory.")
        ctx.assume(f"one shape {_x(shape)} given: multiplying two {_x(shape)} matrices")
        return [shape, shape]
    raise _Fail(f"I found one shape ({_x(shape)}) but a matmul needs both operands: say e.g. "
                f"'{_x(shape)} by {shape[-1]}x1024', or M=.. N=.. K=..")


def _pair_dims(ctx: _Ctx, a: list[int], b: list[int], nk: bool) -> dict[str, int]:
    batch = {}
    if len(b) == 3:
        if len(a) != 3 or a[0] != b[0]:
            raise _Fail(f"the batched operands {_x(a)} and {_x(b)} must have the same batch size.")
        batch = {"B": a[0]}
        a, b = a[1:], b[1:]
    elif len(a) > 2:
        ctx.note("context", f"leading dims {_x(a[:-1])} of {_x(a)} flattened into M={math.prod(a[:-1])}")
    m, k = math.prod(a[:-1]), a[-1]
    if nk and b[1] == k:
        n = b[0]                                   # W is [N, K], as nn.Linear stores it
    elif b[0] == k:
        n = b[1]
        if nk and b[1] != k:
            ctx.assume(f"the second shape {_x(b)} is read as K x N (its first dim matches K={k})")
    else:
        want = "last (or first)" if nk else "first"
        raise _Fail(f"the inner dimensions do not agree: {_x(a)} times {_x(b)} needs the {want} dim of the "
                    f"second operand to equal {k}.")
    return {**batch, "M": m, "N": n, "K": k}


def _linear_dims(ctx: _Ctx) -> dict[str, int]:
    """A linear layer: K in, N out; M from the input shape, the token count or a default."""
    k, n = ctx.sizes.get("in_features"), ctx.sizes.get("out_features")
    _use(ctx, "in_features", "out_features")
    if k is None or n is None:
        raise _Fail("a linear layer needs both its input and output features "
                    "('with 4096 inputs and 11008 outputs', nn.Linear(4096, 11008)).")
    rows = _row_words(ctx)
    if sum(len(s) > 1 for s in ctx.shapes) > 1:     # the input and the weight
        dims = _shape_dims(ctx, "matmul", True)
        if (dims["K"], dims["N"]) != (k, n):
            raise _Fail(f"the shapes give K={dims['K']}, N={dims['N']} but the layer is {k} -> {n} features.")
        return dims
    if ctx.shapes:
        x = _one_shape(ctx)
        if x[-1] != k:
            raise _Fail(f"the input {_x(x)} has last dim {x[-1]} but the layer takes {k} input features.")
        m = math.prod(x[:-1])
        if rows is not None and rows != m:
            raise _Fail(f"the input {_x(x)} has {m} rows but the request also says {rows}.")
        return {"M": m, "N": n, "K": k}
    if rows is None:
        ctx.assume(f"no token count given: using M={DEFAULT_SIZE} rows")
    return {"M": rows or DEFAULT_SIZE, "N": n, "K": k}


def _x(shape: list[int]) -> str:
    return "x".join(map(str, shape))


def _build_conv(ctx: _Ctx, op: str) -> KernelSpec:
    from mtmc.kernels.conv_words import build_conv
    return build_conv(ctx, op)


_BUILDERS = {"softmax": _build_softmax, "reduction": _build_reduction, "norm": _build_norm,
             "elementwise": _build_elementwise, "matmul": _build_matmul, "conv": _build_conv}


# -- the entry points -------------------------------------------------------------------------

def parse_request(text: str) -> ParseResult:
    """A request in words -> ParseResult (spec or a plain-words reason). Never raises."""
    if not isinstance(text, str):
        return ParseResult(None, {}, [], "A kernel request must be text.")
    if len(text) > MAX_CHARS:
        return ParseResult(None, {}, [], f"The request is {len(text)} characters long; I read requests of up "
                           f"to {MAX_CHARS}. To optimize a whole model, upload its module file instead.")
    ctx = _Ctx(text)
    try:
        spec = _parse(ctx)
    except _Fail as exc:
        reason = str(exc)
        no_op = reason.startswith("I found no kernel op")
        return ParseResult(None, ctx.understood, ctx.assumptions, _failure_message(reason, ctx.understood, no_op))
    except Exception as exc:  # a bug must not take the chat down; the message says it is one
        return ParseResult(None, ctx.understood, ctx.assumptions,
                           f"Internal parser error ({type(exc).__name__}: {exc}); please rephrase the request.\n"
                           + _CATALOG_LINE)
    return ParseResult(spec, ctx.understood, ctx.assumptions, _success_message(spec, ctx.assumptions))


def _parse(ctx: _Ctx) -> KernelSpec:
    _read_context(ctx)
    _read_dtype(ctx)
    from mtmc.kernels.conv_words import read_conv   # a convolution's own words (kernel, stride ...)
    read_conv(ctx)
    _read_sizes(ctx)
    _read_formulas(ctx)
    _read_words(ctx)
    _read_axis(ctx)
    _check_leftovers(ctx)
    _check_clauses(ctx)
    family, op = _decide(ctx)
    ctx.understood.update(family=family, op=op)
    spec = _BUILDERS[family](ctx, op)
    _check_sizes_used(ctx, family)
    _check_tensor_count(ctx, spec)
    for key in ("chain", "epilogue", "prologue"):
        pointwise.validate_chain(spec.params.get(key, []))
    spec.request = ctx.request
    return spec


def _vocabulary() -> str:
    return ", ".join([*pointwise.UNARY, *pointwise.SCALAR, *pointwise.BINARY, *pointwise.VECTOR])


_CATALOG_LINE = ("I can write: elementwise chains (relu, gelu, silu, sigmoid, tanh, exp, abs, square, scale/shift "
                 "by a number, clamp, leaky relu, and add/sub/mul/max/min with a second tensor, a bias or a "
                 "residual); reductions along the last dim (sum, mean, max, min, argmax, argmin); softmax and "
                 "log_softmax; layernorm and rmsnorm; matmul, batched matmul and linear layers with a fused "
                 "epilogue; convolutions (1d/2d/3d, transposed, grouped, depthwise) with a fused epilogue. "
                 "For example: 'softmax over the rows of a 4096x8192 fp16 tensor'.")


def _describe_understood(understood: dict) -> str:
    parts = []
    if understood.get("ops"):
        parts.append("ops " + "; ".join(understood["ops"]))
    if understood.get("formula"):
        parts.append("formula " + ", ".join(understood["formula"]))
    if understood.get("shapes"):
        parts.append("shapes " + ", ".join(_x(s) for s in understood["shapes"]))
    if understood.get("sizes"):
        parts.append("sizes " + ", ".join(f"{k}={v}" for k, v in understood["sizes"].items()))
    for key in ("dtype", "axis", "eps", "temperature"):
        if key in understood:
            parts.append(f"{key} {understood[key]}")
    if understood.get("unsupported"):
        parts.append("unsupported " + ", ".join(understood["unsupported"]))
    return "; ".join(parts) if parts else "nothing I could use"


def _failure_message(reason: str, understood: dict, full_catalog: bool) -> str:
    reason = reason[0].upper() + reason[1:]
    catalog = supported_summary() if full_catalog else _CATALOG_LINE
    return f"{reason}\nWhat I understood: {_describe_understood(understood)}.\n{catalog}"


def _success_message(spec: KernelSpec, assumptions: list[str]) -> str:
    dims = ", ".join(f"{k}={v}" for k, v in spec.dims.items())
    details = []
    for key in ("prologue", "chain", "epilogue"):
        if spec.params.get(key):
            details.append(f"{key} {pointwise.describe_chain(spec.params[key])}")
    details += [f"{k} {spec.params[k]}" for k in ("scale", "eps", "b_layout", "affine", "bias", "shape", "kernel",
                                                  "stride", "padding", "dilation", "groups", "output_padding")
                if k in spec.params]
    text = "; ".join([f"{spec.op} ({spec.family}), {dims}, {spec.dtype}", *details]) + "."
    if assumptions:
        text += " Assumed: " + "; ".join(assumptions) + "."
    return text


EXAMPLES = {
    "elementwise": ["add a bias, then gelu, then scale by 0.5 on a 8192x4096 fp16 tensor",
                    "relu(x + y) for two 4096x4096 tensors", "x * sigmoid(x) on a [8, 1024, 4096] bf16 tensor"],
    "reduction": ["row-wise sum of a 4096x8192 float32 tensor", "argmax of each row, 1024 rows of width 50257",
                  "sum of squares over the last dim of a 4096x4096 tensor"],
    "softmax": ["Write a fused softmax over the rows of a 4096x8192 fp16 tensor",
                "scaled softmax with scale 0.125 over 8192 rows and 1024 columns",
                "log softmax of a (2048, 32000) bf16 tensor"],
    "norm": ["rmsnorm on 8192 rows of width 4096", "layernorm of x plus a residual, 4096x1024 bf16, eps 1e-5"],
    "matmul": ["batched matmul 32x512x512 by 32x512x1024 in bf16 with a relu",
               "matmul 4096x4096 by 4096x1024 fp16 with a bias and gelu",
               "linear layer with 4096 inputs and 11008 outputs on a batch of 8192 tokens",
               "x @ W^T + b with x 8192x4096 and W 11008x4096 in fp16"],
    "conv": ["conv2d 3x3 stride 2 padding 1 on 16x64x56x56 float16 with 128 output channels",
             "depthwise conv 5x5 padding 2 on a 8x96x112x112 bf16 input, then relu",
             "transposed conv1d kernel 4 stride 2 padding 1 on 8x32x1024 with 16 output channels and a bias"],
}


def supported_summary() -> str:
    """What can be asked for, in plain words, with examples that parse."""
    lines = ["I can write these kernels (one per request):",
             "- elementwise chains on one tensor: " + ", ".join(pointwise.UNARY)
             + "; with a number: scale, shift, leaky_relu, clamp_min, clamp_max; with a second tensor: "
             + ", ".join(pointwise.BINARY) + "; and bias (a vector over the last dim).",
             "- reductions along the last dim: " + ", ".join(FAMILY_OPS["reduction"])
             + " (ops on the input fuse in: 'sum of squares').",
             "- softmax, log_softmax along the last dim, optionally scaled.",
             "- layernorm, rmsnorm along the last dim, with eps, a residual added before, and pointwise ops "
             "after.",
             "- matmul (M, N, K), batched matmul / bmm (B, M, N, K) and linear layers (x @ W^T), with "
             "pointwise ops fused after (bias, relu, scale, residual ...).",
             "- convolutions: " + ", ".join(FAMILY_OPS["conv"]) + " on an N x C x [D x] [H x] W input, with kernel, "
             "stride, padding (a number, per dim, 'same'), dilation, groups (depthwise), output padding, output "
             "channels, and pointwise ops fused after (bias, relu, scale ...).",
             "Shapes: 4096x8192, (4096, 8192), [32, 128, 4096] (leading dims become rows), '8192 rows of width "
             "4096', M=4096 N=4096 K=1024; 4k means 4096. Dtypes: float32 (default), float16, bfloat16.",
             "Row ops work along the last dim only (over each row).",
             "Examples:"]
    lines += [f"  {family}: " + " | ".join(f"'{e}'" for e in examples) for family, examples in EXAMPLES.items()]
    return "\n".join(lines)
