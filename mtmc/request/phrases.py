"""Phases 1-3 of reading a request: nn.Linear calls, context phrases, negations and clamps;
the dtype; sizes and shapes."""
from __future__ import annotations

import re

from mtmc.kernels.spec import DTYPE_ALIASES
from mtmc.request.reading import INT, NUM, VARS, _Ctx, _Fail, _number, _rx


# -- phase 1: nn.Linear calls, context phrases, negations, clamps --------------------------

_DTYPE_WORD = r"(?:fp|float|bf|bfloat)[\s_-]?(?:16|32)|half|single|float|f16|f32"
_CONTEXT = [
    # Words that describe a kernel's inside or its data, not an op to add.
    r"\battention\s+(?:scores|logits|weights|probs|probabilities|matrix|map)\b",
    r"\bmax[\s_-]*subtraction\b|\bnumerically\s+stable\b|\bmean\s+and\s+var(?:iance)?\b",
    rf"\b(?:accumulat\w*|accum)\s+(?:in\s+)?(?:{_DTYPE_WORD})\b|\b(?:{_DTYPE_WORD})\s+accumulat\w*",
    r"\b(?:int32|int64)\s+(?:indices|index)\b",
    r"\b[1-9][\s-]?d\b(?!\s*[=:])",                     # "a 3d tensor", "2-d"
    # dropout 0 (attention's words ask for no more than this): "no dropout", "dropout p = 0"
    r"\b(?:no|without|w/o)\s+dropout\b|\bdropout[\s_-]*free\b"
    r"|\bdropout(?:[\s_-]*(?:p|prob\w*|rate))?\s*(?:=|:|of|is)?\s*0(?:\.0*)?(?![\d.])",
]
# "subtract the row max" describes a softmax's or a norm's inside; alone it is an op of its own
# (x - max(x)), which the catalog has no kernel for: refused, not dropped
_SUBTRACT_STAT = r"\bsubtract(?:s|ing)?\s+the\s+(?:row\s+|running\s+)?(?:max|maximum|mean)\b"
_NEGATION = (r"\b(?:without|no|w/o)\s+(?:an?\s+|any\s+)?(?P<what>bias|residual)\b"
             r"|\b(?P<what2>bias)\s*=\s*false\b")
# an adjective may sit before "affine": "without elementwise affine" once kept the weight and bias
_AFFINE_WORD = (r"(?:(?:element[\s_-]*wise|learn\w+|trainable)[\s_-]+)?affine"
                r"(?:[\s_-]+(?:params|parameters|transform\w*|weights?))?")
_NO_AFFINE = (rf"\b(?:without|no)\s+(?:an?\s+|the\s+)?(?:{_AFFINE_WORD}|learn\w+\s+(?:weights?|parameters|params)"
              r"|weights?(?:\s+and\s+bias)?|gamma(?:\s+and\s+beta)?)\b"
              r"|\b(?:elementwise_)?affine\s*=\s*false\b")
_AFFINE = (r"\bwith\s+(?:an?\s+|the\s+)?(?:learn\w+\s+)?(?:weights?|gamma|scale)"
           r"(?:\s+and\s+(?:a\s+)?(?:bias|beta|shift))?\b(?!\s*(?:of|=|:|by)?\s*[-+\d.])"
           r"|\bwith\s+(?:an?\s+)?bias\b|\b(?:elementwise_)?affine(?:\s*=\s*true)?\b|\bgamma(?:\s+and\s+beta)?\b"
           rf"|\bwith\s+(?:an?\s+)?{_AFFINE_WORD}\b")
_NORM_WORD = r"\b(?:layer|rms)[\s_-]*norm"
_NORMALIZE_WORD = r"\b(?:l[12]|frobenius)[\s_-]*norm"
_DIVIDE_BY_NORM = (r"\b(?:and\s+|then\s+)?divid\w*\s+(?:the\s+|each\s+)?(?:rows?|x|vectors?|it|them|inputs?|elements?"
                   r"|tensor|matrix)\s+by\s+(?:it|that|its\s+(?:l[12][\s_-]*)?norm|the\s+(?:l[12][\s_-]*)?norm)\b")
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
    if _rx(r"soft[\s_-]?max|norm").search(ctx.s):   # how a softmax or a norm works inside, not an op to add
        for m in ctx.take(_SUBTRACT_STAT):
            ctx.note("context", m.group(0).strip())
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
    if _rx(_NORMALIZE_WORD).search(ctx.s):   # "the L2 norm of each row ... and divide the row by it"
        for m in ctx.take(_DIVIDE_BY_NORM):
            ctx.note("context", m.group(0).strip() + " (the normalization itself)")
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
    if ctx.take(_TF32):   # a compute mode, not a storage dtype: the user allows TF32 products
        found.add("float32")
        ctx.flags.add("tf32")
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
_XSHAPE = r"(?<![\w.])\d+[km]?(?:\s*[x*]\s*\d+[km]?)+(?!\w|\.\d)"
_BY_SHAPE = rf"{INT}(?:\s+by\s+{INT})+"
_NAMED = rf"\b(?P<dims>(?:[bmnk]\s*[=:]\s*)+)(?P<v>{INT})"     # M=4096, M=N=K=1024
_ROWS = r"(?:rows|tokens|vectors|samples|examples|items|logits|predictions)\b"
_SIZE_WORDS = [  # (pattern, the size each group gives); specific phrasings first
    (rf"({INT})\s+{_ROWS}\s+of\s+(?:size\s+|length\s+|width\s+)?({INT})\b", ("rows", "cols")),   # 4096 rows of 8192
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
    # "fully connected layer 784 to 10": right after a layer's word only ("clamp 0 to 6" is a clamp)
    (rf"(?:(?<=linear)|(?<=layer)|(?<=connected)|(?<=dense)|(?<=projection)|(?<=\bfc))\s+({INT})\s+to\s+({INT})\b",
     ("in_features", "out_features")),
    (rf"\bbatch(?:[\s_-]*size)?\s*(?:of|=|:|is)?\s*({INT})", ("batch",)),
    (rf"({INT})\s+(?:batch(?:es)?|sequences|sentences|images|pairs)\b", ("batch",)),
    # "16 matrices of 512x512 times 512x512": a batched product's count (not "2048 by 2048 matrices")
    (rf"({INT})\s+matrices(?=\s+of\b)", ("batch",)),
    (rf"\b(?:seq(?:uence)?[\s_-]*len(?:gth)?|seqlen|context[\s_-]*(?:length|len))\s*(?:of|=|:|is)?\s*({INT})",
     ("seq",)),
    (rf"\bseq(?:uence)?\s*(?:of|=|:|is)?\s*({INT})(?!\s*(?:x|by)\s*\d)", ("seq",)),   # "sequence 1024"
    (rf"({INT})[\s_-]+(?:seq(?:uence)?[\s_-]*len(?:gth)?|seqlen|context[\s_-]*(?:length|len))\b", ("seq",)),
    (rf"({INT})\s+(?:classes|categories|labels)\b", ("cols",)),                          # a loss's classes
    (rf"\brows?\s+of\s+(?:size\s+|length\s+|width\s+)?({INT})(?:\s+elements)?", ("cols",)),
    (rf"\b(?:width|row[\s_-]*(?:length|size|width)|hidden(?:[\s_-]*(?:size|dim\w*))?|d[\s_-]*model"
     rf"|embed\w*[\s_-]*(?:size|dim\w*)|feature[\s_-]*(?:size|dim\w*)|last[\s_-]*dim\w*|cols|columns"
     rf"|num[\s_]*cols|n[\s_]*cols|vocab\w*(?:[\s_-]*size)?)\s*(?:of|=|:|is)?\s*(?:size\s+)?({INT})", ("cols",)),
    (rf"({INT})\s+(?:columns|cols|features|hidden)\b", ("cols",)),
    # a conv's, pool's or channel norm's C ("with 32 channels"); the families without one refuse it
    (rf"({INT})\s+(?:channels|feature[\s_-]*maps)\b|\b(?:num[\s_-]*)?channels\s*(?:=|:|of|is)\s*({INT})", ("channels",)),
    (rf"({INT})[\s-]+wide\b", ("cols",)),
]
_VECTORS = [rf"(?<=bias)\s+(?:vector\s+)?(?:of\s+)?(?:size\s+|length\s+|shape\s+)?({INT})",
            rf"(?<=vectors\s)of\s+(?:size\s+|length\s+)?({INT})(?:\s+elements)?",   # "two vectors of length N": the noun stays
            rf"\b(?:vector|array)\s+of\s+(?:size\s+|length\s+)?({INT})(?:\s+elements)?",
            rf"(?<![\w.])({INT})[\s-]*(?:(?:element|long|dim(?:ensional)?)[\s-]+)?vector\b",
            rf"\b(?:length|size)[\s-]+({INT})[\s-]+vector\b",   # "a length 4096 vector"
            rf"\b(?:tensor|input|buffer)\s+of\s+(?:size|length|numel)\s+({INT})\b",   # a 1-d "tensor of size N"
            rf"({INT})[\s-]+(?:(?:random|input|contiguous)[\s-]+)?(?:elements?|values|numbers|entries|floats)\b"
            r"(?:\s+(?:vector|array|tensor))?"]


def _read_sizes(ctx: _Ctx) -> None:
    # shapes inside a call ("F.layer_norm(x, (4096,))") are sizes; the calls were kept only from
    # the word phases before this one, the formula phase reads them next
    ctx.calls = []
    for pattern, split in ((_TUPLE, r"[^\dkm]+"), (_XSHAPE, r"\s*[x*]\s*")):
        for m in ctx.take(pattern):
            # x.clamp(0, 1) or (x + 3).clamp(0, 6): a method's arguments, no shape
            if pattern == _TUPLE and _rx(rf"(?:(?<![\w.])(?:{VARS})|\))\.[a-z_]\w*$|\b(?:dims?|axis|axes)\s*=\s*$").search(
                    ctx.norm[:m.start()]):
                ctx.s = ctx.s[:m.start()] + m.group(0) + ctx.s[m.end():]   # x.clamp(0, 1): arguments, no shape
                continue
            _add_shape(ctx, m, [t for t in re.split(split, m.group(0)) if t])
    for m in ctx.take(_NAMED):
        for dim in re.findall(r"[bmnk]", m.group("dims")):
            ctx.size(dim.upper(), ctx.to_int(m.group("v")))
    for pattern, keys in _SIZE_WORDS:
        for m in ctx.take(pattern):
            for key, token in zip(keys, [t for t in m.groups() if t is not None]):  # alternatives leave None
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
