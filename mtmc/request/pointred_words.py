"""Activations and reductions in words (a phase and a builder of request.parse).

"selu on a 4096x4096 tensor", "elu with alpha 0.5", "softplus with beta 2 and threshold 10",
"hardswish then mish on a [32, 1024, 1024] bf16 tensor", "x to the power 3", "logsumexp over
the last dim of a 8192x4096 fp16 tensor", "product over each row", "sum over dims 2 and 3 of a
16x64x56x56 tensor", "mean over all dims of a 64x1024x1024 tensor".

`read_pointred` runs before the sizes phase (a parameter such as "alpha 0.5" must not be read as
a size or as the generic "alpha = scale"): it takes the activation words and their parameters as
pointwise steps, the logsumexp / product reduction words as the reduction core, and a list of
dims ("over dims 2 and 3", "over dims (1, 2)", "over all dims") as the axis.  `build_reduction`
serves a reduction over dims other than the last: the one shape's dims, reduced as one run
(N their product, "inner" the product of the dims after them), with steps on the input as its
prologue and operand-free steps after it as its epilogue.
"""
from __future__ import annotations

import math

from mtmc.kernels import pointwise
from mtmc.kernels.spec import KernelSpec
from mtmc.request.build import _around_core, _binds_to_input, _dtype, _one_shape, _steps, _values, _x, variance_params
from mtmc.request.reading import DEFAULT_SIZE, NUM, _Ctx, _Fail, _Item, _number
from mtmc.request.words import is_symbolic, symbolic_axis

_EQ = r"\s*(?:=|:|of|is)?\s*"
_V = r"(?:\s*\(?\s*(?:with\s+)?(?:an?\s+|the\s+)?"   # opens an optional "(with alpha 0.5)"
_P = r"\s*[(,]?\s*(?:with\s+|and\s+)?(?:an?\s+|the\s+)?"   # before one of several named parameters
# (pattern, op, the parameters its named groups hold: group -> (step key, default))
_ACTIVATIONS = [
    (rf"\bc[\s_-]?elu\b{_V}alpha{_EQ}(?P<a>{NUM})\s*\)?)?", "celu", {"a": ("value", 1.0)}),
    (rf"\bs[\s_-]?elu\b", "selu", {}),
    (rf"\belu\b{_V}alpha{_EQ}(?P<a>{NUM})\s*\)?)?", "elu", {"a": ("value", 1.0)}),
    # beta and threshold each optional ("softplus with threshold 10", "softplus, beta=2" were refused)
    (rf"\bsoft[\s_-]?plus\b(?:{_P}beta{_EQ}(?P<b>{NUM}))?(?:{_P}threshold{_EQ}(?P<t>{NUM}))?\s*\)?",
     "softplus", {"b": ("value", 1.0), "t": ("threshold", 20.0)}),
    (r"\bhard[\s_-]?sigmoid\b", "hardsigmoid", {}),
    (r"\bhard[\s_-]?swish\b", "hardswish", {}),
    (r"\bsoft[\s_-]?sign\b", "softsign", {}),
    (r"\bmish\b", "mish", {}),
    (r"\blog[\s_-]?sigmoid\b", "log_sigmoid", {}),
    (r"\b(?:rsqrt|reciprocal\s+square\s+root|inverse\s+square\s+root)\b", "rsqrt", {}),
    (r"\b(?:sqrt|square\s+root)\b", "sqrt", {}),
    (r"\b(?:reciprocal|inverse|1\s*/\s*x)\b", "reciprocal", {}),
    # not "log softmax", "log of (the) softmax": those are log_softmax (request.words)
    (r"\b(?:natural\s+)?(?:log(?:arithm)?|ln)\b(?![\s_-]*(?:soft|sum|sigmoid))(?!\s+of\s+(?:the\s+|a\s+)?soft[\s_-]?max)",
     "log", {}),
    (r"\bsign(?:um)?\b", "sign", {}),
    (r"\berf\b|\berror\s+function\b", "erf", {}),
    (r"\btanh[\s_-]?shrink\b", "tanhshrink", {}),
    (rf"\bsoft[\s_-]?shrink\b{_V}(?:lambda|lambd|threshold){_EQ}(?P<l>{NUM})\s*\)?)?", "softshrink",
     {"l": ("value", 0.5)}),
    (rf"\bhard[\s_-]?shrink\b{_V}(?:lambda|lambd|threshold){_EQ}(?P<l>{NUM})\s*\)?)?", "hardshrink",
     {"l": ("value", 0.5)}),
]
_HARDTANH = (rf"\bhard[\s_-]?tanh\b{_V}min(?:_val)?{_EQ}(?P<lo>{NUM})\s*,?\s*(?:and\s+)?max(?:_val)?{_EQ}"
             rf"(?P<hi>{NUM})\s*\)?)?")
_HARDTANH_RANGE = (rf"\bhard[\s_-]?tanh\s+(?:between|from|in|within|to|clipping\s+to)\s+[\[(]?\s*(?P<lo>{NUM})\s*"
                   rf"(?:and|to|,)\s*(?P<hi>{NUM})\s*[\])]?")   # "hardtanh between -0.5 and 0.5"
# (x ** p is the formula phase's: "x**2 + 1" is one formula)
_POWER = (rf"\b(?:to\s+the\s+power\s+(?:of\s+)?|raised\s+to\s+(?:the\s+power\s+(?:of\s+)?)?|pow(?:er)?\s*\(?\s*"
          rf"(?:x\s*,\s*)?)(?P<p>{NUM})\s*\)?|\b(?P<cube>cubed?)\b")
_REDUCTIONS = [
    (r"\blog[\s_-]*sum[\s_-]*exp\w*\b|\blse\b", "logsumexp"),
    (r"\b(?:reduce[\s_-]*)?prod\b|(?<!cumulative\s)\bproduct\s+(?=(?:reduction|over|along|across|of\s+(?:each|every|all"
     r"|the\s+elements)))", "prod"),
]
_DEVIATION = (r"\b(?:(?P<pop>population|biased)\s+|(?:unbiased|sample)\s+)?"
              r"(?:(?P<std>std|standard\s+deviation)|variance)\b")
_DIM_LIST = (r"\b(?:over|along|across)\s+(?:the\s+)?(?:dims?|dimensions|axes)\s*(?:=\s*)?"
             r"(?P<d>[(\[]?\s*-?\d+(?:\s*(?:,|and)\s*-?\d+)+\s*,?\s*[)\]]?)")
_ALL_DIMS = r"\b(?:over|along|across)\s+(?:all\s+(?:the\s+)?(?:dims|dimensions|axes|elements))\b"


def read_pointred(ctx: _Ctx) -> None:
    """Take the activation and reduction words (see the module doc)."""
    for m in [*ctx.take(_HARDTANH_RANGE), *ctx.take(_HARDTANH)]:
        lo = _number(m.group("lo")) if m.group("lo") else -1.0
        hi = _number(m.group("hi")) if m.group("hi") else 1.0
        if lo > hi:
            raise _Fail(f"'{m.group(0).strip()}' has its min {lo:g} above its max {hi:g}.")
        ctx.add_steps(m, [{"op": "clamp_min", "value": lo}, {"op": "clamp_max", "value": hi}])
    for pattern, op, params in _ACTIVATIONS:
        for m in ctx.take(pattern):
            step = {"op": op}
            for group, (key, default) in params.items():
                value = _number(m.group(group)) if m.group(group) else default
                if value != default or key == "value":
                    step[key] = value
            if op in ("elu", "celu", "softplus") and step["value"] == 0:
                raise _Fail(f"'{m.group(0).strip()}': {op} with {'beta' if op == 'softplus' else 'alpha'} 0 "
                            "is undefined.")
            if op in pointwise.WRITTEN:   # written with the catalog's select and fork steps
                try:
                    ctx.add_steps(m, pointwise.written_steps(op, *([step["value"]] if "value" in step else [])))
                except ValueError as e:
                    raise _Fail(f"'{m.group(0).strip()}': {e}.") from None
                continue
            ctx.add_steps(m, [step])
    for m in ctx.take(_POWER):
        p = 3.0 if m.group("cube") else _number(m.group("p"))
        ctx.add_steps(m, [{"op": "square"} if p == 2 else {"op": "pow", "value": p}])
    for m in ctx.take(_DEVIATION):
        # torch.std is torch.var then a sqrt; "population" is correction 0 (torch's default is 1)
        ctx.add_core(m, "reduction", "var")
        if m.group("pop"):
            ctx.flags.add("population")
        if m.group("std"):
            ctx.items.append(_Item(m.start() + 0.5, m.end(), m.group(0).strip(), step={"op": "sqrt"}, formula=True))
    for pattern, op in _REDUCTIONS:
        for m in ctx.take(pattern):
            ctx.add_core(m, "reduction", op)
    for m in ctx.take(_DIM_LIST):
        ctx.reduce_dim = [int(d) for d in m.group("d").replace("and", ",").strip("()[] ").split(",") if d.strip()]
        ctx.understood["axis"] = ctx.reduce_dim
    for m in ctx.take(_ALL_DIMS):
        ctx.reduce_dim = "all dims"
        ctx.understood["axis"] = "all dims"


def reduces_other_dims(ctx: _Ctx) -> bool:
    """Whether the request reduces over dims this builder serves: a list, every dim, or one
    numbered dim ("over dim 1": a middle dim is read in place, with no transposed copy)."""
    d = ctx.reduce_dim
    return isinstance(d, list) or d == "all dims" or is_symbolic(d) or (isinstance(d, int) and not isinstance(d, bool))


def build_reduction(ctx: _Ctx, op: str) -> KernelSpec:
    """A reduction over a run of dims of the request's one shape (see the module doc)."""
    core, pre, post = _around_core(ctx)
    _values(ctx, "reduction")
    shape = _one_shape(ctx)
    if shape is None and ctx.reduce_dim == "all dims" and not ctx.sizes:   # sum(x): the default tensor, as elsewhere
        shape = [DEFAULT_SIZE, DEFAULT_SIZE]
        ctx.assume(f"no shape given: using {DEFAULT_SIZE}x{DEFAULT_SIZE}")
    if shape is None:
        raise _Fail(f"a {op} over several dims needs the tensor's shape, e.g. 'over dims 2 and 3 of a 16x64x56x56 "
                    "tensor'.")
    nd = len(shape)
    ctx.reduce_dim = symbolic_axis(ctx, nd)
    if ctx.reduce_dim == "all dims":
        dims = list(range(nd))
    else:
        asked = ctx.reduce_dim if isinstance(ctx.reduce_dim, list) else [ctx.reduce_dim]
        if any(not -nd <= d < nd for d in asked):
            raise _Fail(f"dims {asked} are out of range for the {nd}-d shape {_x(shape)}.")
        dims = sorted({d % nd for d in asked})
    if dims != list(range(dims[0], dims[-1] + 1)):
        raise _Fail(f"dims {dims} are not next to each other; a kernel reduces one run of neighbouring dims "
                    f"(like 2 and 3 of a 4-d tensor).")
    if op in ("argmax", "argmin") and len(dims) > 1 and len(dims) < nd:
        raise _Fail(f"{op} takes one dim (or all of them).")
    after = [it for it in post if not _binds_to_input(ctx, core, it)]
    prologue = _steps([it for it in pre + post if it not in after])
    epilogue = _steps(after)
    if any(pointwise.operand_kind(s) for s in epilogue) or (epilogue and op in ("argmax", "argmin")):
        raise _Fail(f"after a {op} only steps without another tensor fit (scale, relu ...), and none after an "
                    "index.")
    n = math.prod(shape[dims[0]:dims[-1] + 1])
    inner = math.prod(shape[dims[-1] + 1:])
    params = {**({"inner": inner} if inner > 1 else {}), **({"prologue": prologue} if prologue else {}),
              **({"epilogue": epilogue} if epilogue else {}), **variance_params(ctx, op)}
    ctx.note("context", f"{op} over dims {dims} of {_x(shape)}: {math.prod(shape) // n} results of {n} values")
    return KernelSpec("reduction", op, {"M": math.prod(shape) // n, "N": n}, _dtype(ctx), params)
