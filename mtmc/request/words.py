"""Phases 5-7 of reading a request: op words (the core op and pointwise steps), the axis a row
op works along, and the checks that nothing is left over."""
from __future__ import annotations

import difflib
import re

from mtmc.kernels import pointwise
from mtmc.kernels.spec import KernelSpec
from mtmc.request.phrases import _XSHAPE
from mtmc.request.reading import (
    MATMUL_WORDS,
    DEFAULT_LEAKY_SLOPE, NUM, _AFTER, _BOUNDARY, _Ctx, _Fail, _Item, _SEQ, _number, _rx, _vocabulary,
)


# -- phase 5: op words ----------------------------------------------------------------------

# ops no phase reads, refused before any phase could read a piece of them ("top-k" once became a
# formula "-k"; "gelu backward" the forward gelu)
_UNSUPPORTED_FIRST = [
    (r"\bbackward(?:s|\s+pass)?\b|\bgrad(?:ient)?s?\b|\bderivatives?\b|\bautograd\b", "backward passes (gradients)"),
    (r"\bsort\w*|\btop[\s_-]?k\b|\bargsort\b", "sorting / top-k"),
    (r"\bfft\b|\bfourier\b", "FFT"),
    (r"\b(?:de)?quanti[sz]\w*", "quantization"),
    # each once read as its near namesake: "log cumsum exp" a plain cumsum, "binary cross entropy" the
    # multi-class one
    (r"\blog[\s_-]*cum[\s_-]*sum[\s_-]*exp\b|\bcum(?:ulative)?[\s_-]*(?:max|min)\w*",
     "scans other than cumsum / cumprod"),
    (r"\bbinary[\s_-]*cross[\s_-]*entropy\w*|\bbce\w*", "binary cross entropy"),
    # "exponential moving average" became a mean of exp(x): a recurrence, no scan of ours computes it
    (r"\b(?:exponential(?:ly)?[\s_-]+(?:weighted[\s_-]+)?)?moving[\s_-]+averag\w*|\bema\b",
     "moving averages (a recurrence along the sequence)"),
    # "negative log likelihood of log-probabilities" became two logs (a wrong kernel)
    (r"\b(?:negative[\s_-]+)?log[\s_-]*likelihood\w*|\bnll\w*", "negative log likelihood (NLL) loss"),
]
_UNSUPPORTED = [  # (pattern, what it is): the words left once the op phases took theirs
    (r"\bconv\w*|\bconvolution\w*", "convolution"),
    (r"\b(?:flash[\s_-]*)?attention\b|\bsdpa\b|\bmulti[\s_-]*head\b", "attention"),
    (r"\bbatch[\s_-]*norm\w*|\bbn\b", "batch norm"),
    (r"\bgroup[\s_-]*norm\w*|\binstance[\s_-]*norm\w*|\bweight[\s_-]*norm\w*", "group/instance/weight norm"),
    (r"\bl[12][\s_-]*norm\w*|\bfrobenius\b|\bvector\s+norm\b", "vector norms (L1/L2)"),
    (r"\bcum[\s_-]*(?:sum|prod)\w*|\bcumulative\b|\bprefix[\s_-]*sums?\b|\bscan\b", "cumulative sums / scans"),
    (r"\bembedding\w*|\bgather\w*|\bscatter\w*|\bindex[\s_-]*select\w*", "gather / scatter / embedding"),
    (r"\b\w*pool\w*", "pooling"),
    (r"\bdropout\b", "dropout"),
    (r"\bcross[\s_-]*entropy\b|\bloss\b|\bnll\b|\bmse\b|\bmean[\s_-]+(?:squared|absolute)[\s_-]+error\b",
     "loss functions"),
    (r"\blog[\s_-]*sum[\s_-]*exp\b", "logsumexp"),
    (r"\btranspos\w*|\bpermut\w*|\breshap\w*|\bconcat\w*", "layout ops (transpose, permute, reshape, concat)"),
    (r"\beinsum\b", "einsum"),
]
# left-over words of ops the catalog does serve (their phase could not read this phrasing): what, how to ask
_SERVED_ELSEWHERE = {"cumulative sums / scans": ("scan", "'cumsum along the rows of a 64x4000 tensor', 'reverse "
                                                 "cumsum over dim 1 of 128x4000', 'exclusive cumsum', or "
                                                 "torch.cumsum(x, dim=1)")}
_UNSUPPORTED_STEPS = (r"\b(?:sqrt|rsqrt|square\s+root|log|ln|log1p|log2|sin|sine|cos|cosine|softplus|mish|elu"
                      r"|selu|celu|hard[\s_-]*(?:swish|sigmoid|tanh)|erf|reciprocal|floor|ceil)\b")
_LAYOUT_NK = (r"\btranspos\w*\s+(?:the\s+)?(?:weight|w|b|rhs|second\s+(?:matrix|operand))\b"
              r"|\b(?:weight|w|b|rhs)\s+(?:is\s+|stored\s+)?transposed\b|\bnk\s+layout\b"
              r"|\bb_layout\s*=?\s*['\"]?nk['\"]?")
_CORES = [  # (pattern, family, op); specific before general ("log softmax" is not also "softmax")
    (r"\blog[\s_-]*soft[\s_-]?max\b|\blogsoftmax\b|\blog\s+of\s+(?:the\s+|a\s+)?soft[\s_-]?max\b", "softmax",
     "log_softmax"),
    (r"\bsoft[\s_-]?max\b", "softmax", "softmax"),
    (r"\brms[\s_-]*norm\w*|\broot[\s_-]+mean[\s_-]+squared?[\s_-]+norm\w*", "norm", "rmsnorm"),
    (r"\blayer[\s_-]*norm\w*", "norm", "layernorm"),
    (r"\bnormali[sz]\w*|\bnorms?\b", "norm", None),
    (rf"\b(?:bmm|batch(?:ed)?[\s_-]*{MATMUL_WORDS})\b", "matmul", "bmm"),
    (rf"\b{MATMUL_WORDS}\b", "matmul", "matmul"),
    (r"\bnn\.linear\b|\blinear(?:[\s_-]+(?:layer|projection|transform\w*))?\b|\bdense[\s_-]+layer\b"
     r"|\bfully[\s_-]*connected(?:[\s_-]+layer)?\b|\bfc(?:[\s_-]+layer)?\b", "matmul", "linear"),
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
         r"(?:tensors|matrices|arrays|vectors|inputs|operands)\b)")
_OTHER = (r"(?:(?:(?:an?|the)\s+)?(?:another|other|second|2nd)\s+(?:[\w-]+\s+)?"
          r"(?:tensor|input|matrix|array|vector|operand)\b|\by\b)")
_BINARY_VERBS = {
    "add": r"add|adds|adding|addition|sum|plus",
    "sub": r"subtract|subtracts|subtracting|subtraction|sub|minus|difference",
    "mul": r"hadamard\s+product|multiply|multiplies|multiplying|multiplied|multiplication|mul|times|product",
    "div": r"divide|divides|dividing|divided|division|div",
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
    (r"gelu[\s_-]*(?:\(\s*)?(?:approximate\s*=\s*['\"]?tanh['\"]?\s*\)?"
     r"|(?:(?:with|using)\s+)?(?:the\s+|a\s+)?tanh(?:[\s_-]*approx\w*)?(?:\s*\))?)"
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
_ADD_NORM = r"\b(?:residual[\s_-]+)?add\s*(?:\+|&|and|-)\s*(?=(?:layer|rms)[\s_-]*norm)"
_MATVEC = r"\b(?:[sdh]?gemv|mat[\s_-]?vec|matrix[\s_-]*vector(?:[\s_-]+(?:multipl\w*|products?|mult))?)\b"
_ELEMENTWISE_WORDS = r"\b(?:element|point)[\s_-]*wise\b|\bhadamard\b"
_MULTIPLY = r"\b(?:multipl\w*|times|product(?:\s+of)?)\b(?!\s*(?:by\s+|with\s+)?[-+]?[\d.])"


def refuse_unsupported(ctx: _Ctx, table=None) -> None:
    """Fail with the first op of `table` (default: the ones refused first) the request names."""
    for pattern, what in (_UNSUPPORTED_FIRST if table is None else table):
        for m in ctx.take(pattern):
            ctx.note("unsupported", what)
            if what in _SERVED_ELSEWHERE:   # the catalog has it; this phrasing is what could not be read
                name, examples = _SERVED_ELSEWHERE[what]
                raise _Fail(f"I could not read this {name} ('{m.group(0).strip()}'): say it e.g. as {examples}.")
            raise _Fail(f"{what[0].upper() + what[1:]} ('{m.group(0).strip()}') is not in the catalog yet, "
                        "so I cannot write it.")


# "sigmoid then multiply by the input": x * sigmoid(x) (request.build makes it one fork step)
GATE = "gate_by_input"
_BY_INPUT = (r"\bmultipl\w*\s+(?:it\s+|the\s+result\s+)?by\s+(?:the\s+)?(?:original\s+|same\s+)?(?:input(?:\s+tensor)?|x)\b"
             r"(?!\s*(?:and|with|by|to|from)\s+y\b)|\btimes\s+(?:the\s+)?(?:original\s+|same\s+)?input\b")


# einsum's matrix-product forms -> (op, B read as [N, K]); other equations are refused with the reason
_EINSUM = r"\beinsum\s*\(?\s*['\"]?(?P<eq>[a-z]+\s*,\s*[a-z]+\s*->\s*[a-z]+)['\"]?"
_EINSUM_FORMS = {("ij", "jk", "ik"): ("matmul", False), ("ij", "kj", "ik"): ("matmul", True),
                 ("bij", "bjk", "bik"): ("bmm", False), ("bij", "bkj", "bik"): ("bmm", True)}


def _read_einsum(ctx: _Ctx) -> None:
    """"einsum bij,bjk->bik": a matmul or bmm when the equation is one (any letters), else refused."""
    for m in ctx.take(_EINSUM):
        a, rest = re.sub(r"\s", "", m.group("eq")).split(",")
        b, out = rest.split("->")
        roles = _einsum_roles(a, b, out)
        rename = dict(zip(*roles)) if roles else None   # any letters: "mk,nk->mn" is "ij,kj->ik"
        form = _EINSUM_FORMS.get(tuple("".join(rename[c] for c in t) for t in (a, b, out))) if rename else None
        if form is None:
            raise _Fail(f"einsum '{m.group('eq')}' is not a matrix product (ij,jk->ik or bij,bjk->bik, either "
                        "operand as written or transposed); upload the module: its einsums are captured there.")
        op, nk = form
        if nk:
            ctx.flags.add("nk")
        ctx.add_core(m, "matmul", op)


def _einsum_roles(a: str, b: str, out: str):
    """(letters, roles b/i/j/k) of a two-operand einsum: the batch letter in all three, i in a and
    out only, k in b and out only, j (contracted) in a and b only; None when letters fit no role."""
    letters = sorted(set(a + b + out))
    roles = []
    for c in letters:
        where = (c in a, c in b, c in out)
        role = {(True, True, True): "b", (True, False, True): "i", (False, True, True): "k",
                (True, True, False): "j"}.get(where)
        if role is None or any(t.count(c) > 1 for t in (a, b, out)):
            return None
        roles.append(role)
    return (letters, roles) if sorted(roles) in (["i", "j", "k"], ["b", "i", "j", "k"]) else None


def _read_words(ctx: _Ctx) -> None:
    _read_einsum(ctx)
    for m in ctx.take(_LAYOUT_NK):
        ctx.flags.add("nk")
        ctx.note("ops", f"{m.group(0).strip()!r} -> weight stored [N, K]")
    refuse_unsupported(ctx, _UNSUPPORTED)
    for m in ctx.take(_MATVEC):   # its one matrix shape times a vector ("gemv 8192x4096" was refused)
        ctx.flags.add("matvec")
        ctx.add_core(m, "matmul", "matmul")
    for m in ctx.take(_BY_INPUT):   # before the products: "multiply by the input" names no second tensor
        ctx.add_steps(m, [{"op": GATE}])
    _read_matrix_product(ctx)
    for op, verbs in _BINARY_VERBS.items():
        for m in ctx.take(_binary_pattern(verbs)):
            # "x squared plus y squared": the second "squared" is y's own step, not one after the sum
            post = _rx(r"\s*squared\b").match(ctx.s, m.end()) if m.group(0).rstrip().endswith("y") else None
            if post:
                ctx.use(post.start(), post.end())
            ctx.add_steps(m, [{"op": op, **({"pre": [{"op": "square"}]} if post else {})}])
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
    for m in ctx.take(r"\b(?P<act>swi|ge|re)[\s_-]?glu\b(?![\s_-]*like)"):   # a gated unit of two tensors
        act = {"swi": "silu", "ge": "gelu", "re": "relu"}[m.group("act")]
        ctx.add_steps(m, [{"op": act}, {"op": "mul"}])
        ctx.assume(f"{m.group(0).strip()} read as {act}(x) * y: the activation on the first tensor, times the second")
    for words, steps in _UNARY_WORDS:
        for m in ctx.take(rf"{_VERB}\b(?:{words})\b(?:\s+activation)?"):
            ctx.add_steps(m, [dict(s) for s in steps])
    for m in ctx.take(_ELEMENTWISE_WORDS):   # a chain needs no more than its steps
        ctx.note("context", m.group(0).strip())


def _read_matrix_product(ctx: _Ctx) -> None:
    """"a 1024x512 matrix times a 512x256 matrix", "multiply two 4096x4096 matrices", "8 batches
    of 64x128 times 128x96": a matmul, unless the request says elementwise (then it is the mul step).
    An outer product of two vectors is the matmul [M, 1] x [1, N] (request.build)."""
    for m in ctx.take(r"\bouter[\s_-]*products?\b"):
        ctx.flags.add("outer")
        ctx.add_core(m, "matmul", "matmul")
    elementwise = bool(_rx(_ELEMENTWISE_WORDS).search(ctx.s))
    _read_shape_product(ctx, elementwise)
    if elementwise:
        return
    if not (_rx(r"\bmatri(?:x|ces)\b").search(ctx.s) or _two_matrices(ctx) or "matvec" in ctx.flags):
        if len(ctx.shapes) == 2 and ctx.shapes[0] == ctx.shapes[1] and len(ctx.shapes[0]) == 2 \
                and ctx.shapes[0][0] == ctx.shapes[0][1] and _rx(_MULTIPLY).search(ctx.s) \
                and not _rx(_binary_pattern(_BINARY_VERBS["mul"])).search(ctx.s):
            shape = "x".join(map(str, ctx.shapes[0]))
            raise _Fail(f"two {shape} matrices multiplied could be either product: say 'elementwise' for the "
                        "elementwise one or 'matrix product' for the matmul.")
        return
    for pattern, family, op in _CORES:   # "batched matrix multiply" is a bmm, before its "multiply" a matmul
        for m in (ctx.take(pattern) if op in ("bmm", "matmul") else ()):
            ctx.add_core(m, family, op)
    for m in ctx.take(_MULTIPLY):
        ctx.add_core(m, "matmul", "matmul")


def _two_matrices(ctx: _Ctx) -> bool:
    """Exactly two 2-d shapes of different sizes whose inner dims agree as a matrix product (as
    [M, K] [K, N], or [M, K] [N, K] when B is said transposed): "multiply A (1024x4096) by B
    (4096x2048)" names a matmul though it never says "matrix".  Equal shapes stay elementwise."""
    if len(ctx.shapes) != 2 or any(len(s) != 2 for s in ctx.shapes):
        return False
    a, b = ctx.shapes
    return a != b and a[1] == (b[1] if "nk" in ctx.flags else b[0])


_SHAPE_TIMES = (rf"(?P<a>{_XSHAPE})\s+(?P<v>times|multiplied\s+(?:by|with)|@|matmul(?:ed)?\s+(?:by|with))"
                rf"\s+(?:an?\s+|the\s+)?(?P<b>{_XSHAPE})")


def _read_shape_product(ctx: _Ctx, elementwise: bool) -> None:
    """"64x128 times 128x96": two shapes whose inner dims agree, joined by a multiplying word, are a
    matrix product; with a batch count ("8 batches of ...") a batched one.  "64x64 times 64x64
    elementwise" is the mul step."""
    for m in _rx(_SHAPE_TIMES).finditer(ctx.norm):
        if ctx.s[m.start("v"):m.end("v")] != m.group("v"):
            continue                                   # the verb was read already
        a, b = (_rx(r"\d+[km]?").findall(m.group(g)) for g in ("a", "b"))
        inner = len(b) in (2, 3) and len(a) >= 2 and a[-1] == b[-2]
        if elementwise or (a == b and not inner):     # equal shapes that cannot be a matrix product
            if a == b:
                ctx.use(m.start("v"), m.end("v"))
                ctx.add_steps(m, [{"op": "mul"}])
            continue
        if not inner:
            continue                                   # left for the leftover check to refuse
        ctx.use(m.start("v"), m.end("v"))
        op = "bmm" if "batch" in ctx.sizes and len(b) == 2 else "matmul"
        ctx.items.append(_Item(m.start("v"), m.end("v"), m.group("v"), family="matmul", op=op))
        ctx.note("ops", f"{m.group(0).strip()!r} -> {op} (a matrix product: the inner dims agree)")
        if a == b:
            ctx.assume(f"'{m.group(0).strip()}' read as a matrix product; say 'elementwise' for the "
                       "elementwise one")


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
_OTHER_AXES = [  # (pattern, the axis: a dim, or words symbolic_axis resolves or _check_axis refuses)
    # each column of a matrix: dim 0 (symbolic_axis; other ranks are asked for a number)
    (r"\b(?:column[\s_-]*wise|per[\s_-]+column|(?:each|every)\s+column|down\s+(?:the\s+)?columns?)\b", "columns"),
    # "across the columns" reads both ways (each row across its columns, or each column): refused
    (r"\b(?:over|along|across)\s+(?:the\s+)?columns?\b", "the columns"),
    (r"\b(?:over|along|across)\s+(?:the\s+)?(?:first|leading|outer)\s+(?:dim\w*|axis)\b", 0),
    (r"\b(?:last|final|first)\s+(?:two|three|four|[2-9])\s+(?:dim\w*|axes)\b", "several dims"),  # not after "over"
    (r"\b(?:all\s+(?:the\s+)?(?:elements|dims|dimensions|axes|values)"
     r"|(?:the\s+)?(?:whole|entire)\s+(?:tensor|matrix|array)"
     r"|global(?:ly)?|full\s+reduction|to\s+a\s+(?:single\s+)?scalar)\b", "all elements"),
]
_AXIS_NUMBER = r"\b(?:dim|axis|dimension)\s*(?:=|:)?\s*(?P<d>-?\d+)(?!\w|\.\d)"
# Axes named in words, each once ignored (the op silently ran over the last dim): "the second
# dim" is dim 1, "the batch dim" dim 0; "the middle dim" (dim 1 of a 3-d tensor), "the spatial
# dims" / "height and width" (every dim after the channels) and "the last two dims" depend on the
# rank, so they stay words until the shape resolves them (symbolic_axis)
_ORDINALS = {"second": 1, "third": 2, "fourth": 3, "fifth": 4, "middle": "middle"}
_AXIS_ORDINAL = (r"\b(?:over|along|across)\s+(?:the\s+)?(?P<o>second|third|fourth|fifth|middle)\s+"
                 r"(?:dim\w*|axis)\b")
_OVER = r"\b(?:over|along|across)\s+(?:the\s+|all\s+(?:the\s+)?)?"
_AXIS_WORDS = [
    (_OVER + r"(?:spatial|space)\s+(?:dim\w*|axes|positions|locations)\b", "spatial"),
    (_OVER + r"(?:height|h)\s*(?:and|,|x)\s*(?:width|w)(?:\s+(?:dim\w*|axes))?\b", "spatial"),
    (_OVER + r"batch\s+(?:dim\w*|axis)\b", 0),
    # [batch, sequence, features]: "over the sequence dim" was ignored (the op ran over the last dim)
    (_OVER + r"(?:sequence|seq|time|tokens?|length)\s+(?:dim\w*|axis)\b", "sequence"),
    (_OVER + r"(?:feature|features|hidden|embedding|model|last)\s+(?:dim\w*|axis)\b", "last"),
    (_OVER + r"(?P<end>last|final|first)\s+(?P<k>two|three|four|[2-9])\s+(?:dim\w*|axes)\b", None),
]
_COUNTS = {"two": 2, "three": 3, "four": 4}


_ROW_OP = r"\brows?(?=[\s_-]+(?:sums?|means?|max\w*|min\w*|arg[\s_-]?(?:max|min)|averages?|reduc\w*)\b)"


def _read_axis(ctx: _Ctx) -> None:
    for m in _rx(_ROW_OP).finditer(ctx.norm):   # "row sum": the op words are already taken
        if ctx.s[m.start():m.end()] == m.group(0):
            ctx.s = ctx.s[:m.start()] + " " * (m.end() - m.start()) + ctx.s[m.end():]
            ctx.reduce_dim = "last"
    for pattern, axis in _AXIS_WORDS:
        for m in ctx.take(pattern):
            if axis is None:   # "last two dims" -> "last 2"
                k = _COUNTS.get(m.group("k")) or int(m.group("k"))
                axis = f"{'first' if m.group('end') == 'first' else 'last'} {k}"
            ctx.reduce_dim = axis
    for m in ctx.take(_LAST_AXIS):
        ctx.reduce_dim = ctx.reduce_dim if ctx.reduce_dim is not None else "last"
    for pattern, where in _OTHER_AXES:
        if ctx.take(pattern):
            ctx.reduce_dim = where
    for m in ctx.take(_AXIS_ORDINAL):
        ctx.reduce_dim = _ORDINALS[m.group("o")]
    for m in ctx.take(_AXIS_NUMBER):
        ctx.reduce_dim = int(m.group("d"))
    for m in ctx.take(_OVER + r"(?P<w>[a-z]+)\s+(?:dim\w*|axis)\b"):   # a dim named by a word we do not know
        raise _Fail(f"I do not know which dim '{m.group('w')} dim' is; name it by number (e.g. 'over dim 1').")
    if ctx.reduce_dim is not None:
        ctx.understood["axis"] = ctx.reduce_dim


SYMBOLIC_AXES = ("middle", "spatial", "columns", "sequence")   # and "last K" / "first K": resolved by symbolic_axis


def is_symbolic(d) -> bool:
    return isinstance(d, str) and (d in SYMBOLIC_AXES or d.startswith(("last ", "first ")))


def symbolic_axis(ctx: _Ctx, ndim: int):
    """The request's axis with words that depend on the rank made numbers: "middle" is dim 1 of a
    3-d tensor (ambiguous at other ranks: refused), "spatial" every dim after batch and channels
    (NC + spatial, 3-d or more), "last K" / "first K" that run of dims."""
    d = ctx.reduce_dim
    if not is_symbolic(d):
        return d
    if d == "middle":
        if ndim != 3:
            raise _Fail(f"'the middle dim' of a {ndim}-d tensor is ambiguous; name it by number (e.g. 'over dim 1').")
        return 1
    if d == "sequence":   # [batch, sequence, features], or [sequence, features]
        if ndim not in (2, 3):
            raise _Fail(f"'the sequence dim' of a {ndim}-d tensor is ambiguous; name it by number (e.g. 'over dim 1').")
        ctx.assume(f"the sequence dim read as dim {ndim - 2} of [{'batch, ' if ndim == 3 else ''}sequence, features]")
        return ndim - 2
    if d == "columns":
        if ndim != 2:
            raise _Fail(f"'the columns' of a {ndim}-d tensor is ambiguous; name the dim by number (e.g. 'over dim 0').")
        ctx.assume("'the columns' read as dim 0 (each column, down its rows); say 'each row' for the last dim")
        return 0
    if d == "spatial":
        if ndim < 3:
            raise _Fail(f"a {ndim}-d tensor has no spatial dims (they follow batch and channels: N, C, H, W).")
        return list(range(2, ndim))
    end, k = d.split()
    if int(k) > ndim:
        raise _Fail(f"the {end} {k} dims of a {ndim}-d tensor: it has only {ndim}.")
    return list(range(int(k))) if end == "first" else list(range(ndim - int(k), ndim))


def _check_axis(ctx: _Ctx, ndim: int, what: str) -> None:
    """Row ops work along the last dim; anything else is refused, never silently transposed."""
    d = symbolic_axis(ctx, ndim)
    if d is None or d == "last" or d == [ndim - 1]:
        return
    if isinstance(d, int) and -ndim <= d < ndim and d % ndim == ndim - 1:
        return
    where = d if isinstance(d, str) else f"dims {d}" if isinstance(d, list) else f"dim {d}"
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
    if spec.family in ("matmul", "loss") or not ("pair" in ctx.flags or _rx(_PAIR).search(ctx.norm)):
        return
    steps = [s for k in ("chain", "prologue", "epilogue") for s in spec.params.get(k, [])]
    if not any(pointwise.operand_kind(s) == "full" for s in steps):
        raise _Fail(f"the request names two tensors, but the ops I read ({', '.join(ctx.understood.get('ops', []))}) "
                    "take only one; say how the second one enters, e.g. 'x - y', 'multiply by another tensor', "
                    "'relu(x + y)'.")
