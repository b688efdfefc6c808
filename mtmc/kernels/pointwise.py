"""The pointwise op vocabulary shared by elementwise chains and fused epilogues.

A chain is a list of steps, each a dict: {"op": NAME} plus "value" for scalar steps.  Every op
has a Triton expression (computed in fp32 inside kernels) and a torch expression (the reference,
run in float64 by the verifier and in the native dtype for eager timing).  Operand steps read a
second tensor: "bias" a vector over the last dim N, the binary ops a full [M, N] tensor, or,
with "every" and "period" in the step, a broadcast ("periodic") operand of `period` values:
element i of x (row-major over the whole tensor) meets operand[(i // every) % period].  That is
how a [C, 1, 1] bias or an [S, S] mask broadcasts over a larger tensor, read in place instead
of expanded to full size.  With "scalar": true in the step, the operand is one value (a 0-d
parameter, a [1] shift) every element meets: any kernel loads it once (operand_load) whatever
its layout, from the tensor at run time, so updates to a parameter reach the kernel.
A two-operand step may carry "pre", one-input steps applied to its operand as it is loaded
(relu(x) + relu(y) is [relu, add with pre [relu]]: one kernel for a formula of two tensors).
Mask steps (masked_fill, masked_keep) read a bool operand; a select step is torch.where of a
comparison of one value with a number, each branch a number or steps of that value.

Two more kinds of step: "fork" ({"op": "fork", "binop": "mul", "left": [...], "right": [...]})
is binop(left(x), right(x)) for a formula that reads x twice (x * clamp(x + 3, 0, 6) / 6); and
the indexed steps (tril, triu) read each element's row and column, which only a kernel that
defines `row_idx` and `col_idx` for its tile (the matmul epilogue) can give them.  Expressions
of functions that overflow or cancel in fp32 (softplus, mish, ELU) use stable forms built from
exp and arithmetic alone (_log1p_exp_neg, _expm1), accurate to ~1e-7 wherever the result is
representable, with no reliance on libdevice's log1p/expm1.
"""
from __future__ import annotations

import math

def _expm1(y: str) -> str:
    """exp(y) - 1 without the cancellation near 0: a degree-7 Taylor polynomial for |y| < 0.5
    (relative error < 2e-7), exp(y) - 1 elsewhere."""
    poly = f"({y}) * (1.0 + ({y}) * (0.5 + ({y}) * (1.0 / 6 + ({y}) * (1.0 / 24 + ({y}) * (1.0 / 120 + ({y}) * (1.0 / 720 + ({y}) * (1.0 / 5040)))))))"
    return f"tl.where(tl.abs({y}) < 0.5, {poly}, tl.exp({y}) - 1.0)"


def _log1p_exp_neg(z: str) -> str:
    """log(1 + exp(-|z|)) from exp and arithmetic only: with e = exp(-|z|) in (0, 1] and
    t = e / (2 + e) <= 1/3, log1p(e) = 2 atanh(t), a series in t^2 <= 1/9 (relative error < 1e-7,
    also where e is tiny and log(1 + e) would round to 0)."""
    e = f"tl.exp(-tl.abs({z}))"
    t = f"({e} / (2.0 + {e}))"
    u = f"({t} * {t})"
    series = f"(1.0 + {u} * (1.0 / 3 + {u} * (1.0 / 5 + {u} * (1.0 / 7 + {u} * (1.0 / 9 + {u} * (1.0 / 11 + {u} / 13))))))"
    return f"(2.0 * {t} * {series})"


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
_RELU6_3 = "tl.minimum(tl.maximum({x} + 3.0, 0.0), 6.0)"

# name -> (triton expression, torch expression); {x} is the running value.
UNARY = {
    "relu": ("tl.maximum({x}, 0.0)", "torch.relu({x})"),
    "gelu": ("0.5 * {x} * (1.0 + tl.math.erf({x} * 0.7071067811865476))",
             "torch.nn.functional.gelu({x})"),
    "gelu_tanh": ("0.5 * {x} * (1.0 + (2.0 * tl.sigmoid(1.5957691216057308 * ({x} + 0.044715 * {x} * {x} * {x})) - 1.0))",
                  "torch.nn.functional.gelu({x}, approximate='tanh')"),
    "silu": ("{x} * tl.sigmoid({x})", "torch.nn.functional.silu({x})"),
    "sigmoid": ("tl.sigmoid({x})", "torch.sigmoid({x})"),
    # tanh through sigmoid: tl.math.tanh is missing from some Triton versions and the interpreter.
    "tanh": ("(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)", "torch.tanh({x})"),
    "exp": ("tl.exp({x})", "torch.exp({x})"),
    "abs": ("tl.abs({x})", "torch.abs({x})"),
    "neg": ("(-{x})", "(-{x})"),
    "square": ("({x} * {x})", "({x} * {x})"),
    "selu": (f"{SELU_SCALE!r} * tl.where({{x}} > 0.0, {{x}}, {SELU_ALPHA!r} * " + _expm1("tl.minimum({x}, 0.0)") + ")",
             "torch.selu({x})"),
    "hardsigmoid": (f"({_RELU6_3} / 6.0)", "torch.nn.functional.hardsigmoid({x})"),
    "hardswish": (f"({{x}} * {_RELU6_3} / 6.0)", "torch.nn.functional.hardswish({x})"),
    "softsign": ("({x} / (1.0 + tl.abs({x})))", "torch.nn.functional.softsign({x})"),
    # x * tanh(softplus(x)) = x * n / (n + 2) with n = e^x (e^x + 2): no cancellation, and past
    # x = 20 the factor is 1 in fp32 (e^x would overflow at 44)
    "mish": ("{x} * tl.where({x} > 20.0, 1.0, (tl.exp(tl.minimum({x}, 20.0)) * (tl.exp(tl.minimum({x}, 20.0)) + 2.0))"
             " / (tl.exp(tl.minimum({x}, 20.0)) * (tl.exp(tl.minimum({x}, 20.0)) + 2.0) + 2.0))",
             "torch.nn.functional.mish({x})"),
    "log_sigmoid": ("(tl.minimum({x}, 0.0) - " + _log1p_exp_neg("{x}") + ")", "torch.nn.functional.logsigmoid({x})"),
    "log": ("tl.log({x})", "torch.log({x})"),
    "sqrt": ("tl.sqrt({x})", "torch.sqrt({x})"),
    "rsqrt": ("tl.math.rsqrt({x})", "torch.rsqrt({x})"),
    "reciprocal": ("(1.0 / {x})", "torch.reciprocal({x})"),
    "sign": ("tl.where({x} > 0.0, 1.0, tl.where({x} < 0.0, -1.0, 0.0))", "torch.sign({x})"),
    "erf": ("tl.math.erf({x})", "torch.erf({x})"),
}
# name -> (triton, torch); {v} is the step's scalar "value".
SCALAR = {
    "scale": ("({x} * {v})", "({x} * {v})"),
    "shift": ("({x} + {v})", "({x} + {v})"),
    "leaky_relu": ("tl.where({x} >= 0.0, {x}, {x} * {v})", "torch.nn.functional.leaky_relu({x}, {v})"),
    "clamp_min": ("tl.maximum({x}, {v})", "torch.clamp({x}, min={v})"),
    "clamp_max": ("tl.minimum({x}, {v})", "torch.clamp({x}, max={v})"),
    "elu": ("tl.where({x} > 0.0, {x}, {v} * " + _expm1("tl.minimum({x}, 0.0)") + ")",
            "torch.nn.functional.elu({x}, {v})"),
    # PyTorch's CELU: max(0, x) + min(0, alpha * (exp(x / alpha) - 1)), for either sign of alpha
    "celu": ("(tl.maximum({x}, 0.0) + tl.minimum(0.0, {v} * " + _expm1("tl.minimum({x}, 0.0) / {v}") + "))",
             "torch.celu({x}, {v})"),
    # value is beta; above `threshold` (beta * x > threshold) PyTorch returns x itself
    "softplus": ("tl.where({v} * {x} > {threshold}, {x}, (tl.maximum({v} * {x}, 0.0) + "
                 + _log1p_exp_neg("{v} * {x}") + ") / {v})",
                 "torch.nn.functional.softplus({x}, {v}, {threshold})"),
}
# Optional numeric keys of a step beside "value", with their defaults (formatted like {v}).
EXTRA = {"softplus": {"threshold": 20.0}}
# "pow": x ** value, written per exponent (pow_expr); the indexed steps keep the elements on one
# side of the matrix diagonal `value` and zero the rest (torch.tril / torch.triu).
POWER = {"pow": (None, "torch.pow({x}, {v})")}
INDEXED = {"tril": ("tl.where(col_idx - row_idx <= {v}, {x}, 0.0)", "torch.tril({x}, int({v}))"),
           "triu": ("tl.where(col_idx - row_idx >= {v}, {x}, 0.0)", "torch.triu({x}, int({v}))")}
# A fork step's binop (two values of one element).
FORK_BINOPS = ("add", "sub", "mul", "div", "maximum", "minimum")
# name -> (triton, torch); {y} is the operand tensor's value.
BINARY = {
    "residual": ("({x} + {y})", "({x} + {y})"),
    "add": ("({x} + {y})", "({x} + {y})"),
    "sub": ("({x} - {y})", "({x} - {y})"),
    "mul": ("({x} * {y})", "({x} * {y})"),
    "maximum": ("tl.maximum({x}, {y})", "torch.maximum({x}, {y})"),
    "minimum": ("tl.minimum({x}, {y})", "torch.minimum({x}, {y})"),
    "div": ("({x} / {y})", "({x} / {y})"),
    "rdiv": ("({y} / {x})", "({y} / {x})"),
    # PReLU: x where x >= 0, else its weight times x (the weight per channel, read periodic)
    "prelu": ("tl.where({x} >= 0.0, {x}, {x} * {y})", "torch.where({x} >= 0, {x}, {x} * {y})"),
}
# Mask steps: the operand is a boolean mask (read as nonzero = set), {v} the fill value:
# x.masked_fill(mask, v) and torch.where(mask, x, v).  The mask may be periodic (broadcast).
MASKED = {"masked_fill": ("tl.where({y} != 0, {v}, {x})", "torch.where({y} != 0, {v}, {x})"),
          "masked_keep": ("tl.where({y} != 0, {x}, {v})", "torch.where({y} != 0, {x}, {v})")}
# A select step ({"op": "select", "cond": [...], "cmp": "gt", "value": v, "then": [...] or a
# number, "else": ...}) is torch.where(cond(x) CMP v, then(x), else(x)) on one value x.
CMP = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "==", "ne": "!="}
CMP_FLIPPED = {"gt": "lt", "lt": "gt", "ge": "le", "le": "ge", "eq": "eq", "ne": "ne"}   # c < x is x > c
# "bias" adds a vector over the last dim; its operand is [N].
VECTOR = {"bias": ("({x} + {y})", "({x} + {y})")}

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "leaky_relu", "elu", "selu", "celu",
               "hardsigmoid", "hardswish", "softplus", "softsign", "mish", "log_sigmoid")

# Local bounds on |d step / d x| (how an error in x grows through a step), as torch expressions
# of the pre-step value x, the error scale s, the operand {y} and the step's {v}; steps not
# listed pass an error on at most unchanged.  Error scales of fused epilogues are built on it.
ERROR_GAIN = {
    "gelu": "1.13 * s", "gelu_tanh": "1.13 * s", "silu": "1.1 * s", "sigmoid": "0.25 * s",
    "exp": "torch.exp(x) * s", "square": "(2 * x.abs() + s) * s",
    "scale": "abs({v}) * s", "leaky_relu": "max(1.0, abs({v})) * s", "mul": "s * {y}.abs()",
    "elu": "max(1.0, abs({v})) * s", "selu": "1.7581 * s", "hardswish": "1.5 * s", "mish": "1.1 * s",
    "log": "s / x.abs()", "sqrt": "0.5 * s / x.abs().sqrt()", "rsqrt": "0.5 * s * x.abs() ** -1.5",
    "reciprocal": "s / (x * x)", "erf": "1.13 * s", "prelu": "max(1.0, float({y}.abs().max())) * s", "div": "s / {y}.abs()", "rdiv": "{y}.abs() * s / (x * x)",
    "pow": "abs({v}) * (x.abs() + (s if {v} >= 1 else 0)) ** ({v} - 1) * s",
    # sign jumps by up to 2 where x is within its error of 0: allow a flip there
    "sign": "(x.abs() <= 0.05 * s) * 2e4",
}


def written_steps(op: str, *values: float) -> list[dict]:
    """Steps of the activations written with other steps: tanhshrink (x - tanh(x)), softshrink
    with lambd (x - clamp(x, -l, l): exactly 0 between), hardshrink with lambd (x where |x| > l,
    else 0) and threshold with its threshold and value (x where x > threshold, else value).
    ValueError for a negative lambd."""
    if op == "tanhshrink":
        return [{"op": "fork", "binop": "sub", "left": [], "right": [{"op": "tanh"}]}]
    if op in ("softshrink", "hardshrink") and values[0] < 0:
        raise ValueError(f"{op}'s lambd must be at least 0")
    if op == "softshrink":
        return [{"op": "fork", "binop": "sub", "left": [],
                 "right": [{"op": "clamp_min", "value": -values[0]}, {"op": "clamp_max", "value": values[0]}]}]
    if op == "hardshrink":
        return [{"op": "select", "cond": [{"op": "abs"}], "cmp": "gt", "value": values[0], "then": [], "else": 0.0}]
    if op == "threshold":
        return [{"op": "select", "cond": [], "cmp": "gt", "value": values[0], "then": [], "else": values[1]}]
    raise ValueError(f"{op} is not a written-out activation")


WRITTEN = ("tanhshrink", "softshrink", "hardshrink", "threshold")


def all_ops() -> set[str]:
    return set(UNARY) | set(SCALAR) | set(BINARY) | set(VECTOR) | set(POWER) | set(INDEXED) | set(MASKED) | {
        "fork", "select"}


def takes_value(op: str) -> bool:
    return op in SCALAR or op in POWER or op in INDEXED or op in MASKED or op == "select"


def number(v: float) -> str:
    """A float literal Python and Triton both read (inf and nan have no repr literal)."""
    v = float(v)
    return repr(v) if math.isfinite(v) else f"float('{v}')"


def pow_expr(x: str, v: float) -> str:
    """Triton x ** v: products for small integer powers (exact signs for negative x), sqrt for
    0.5, exp(v * log(x)) otherwise (NaN for negative x, as in PyTorch)."""
    if v == int(v) and 0 < abs(v) <= 8:
        prod = " * ".join([x] * int(abs(v)))
        return f"({prod})" if v > 0 else f"(1.0 / ({prod}))"
    if v == 0:
        return f"({x} * 0.0 + 1.0)"
    if v == 0.5:
        return f"tl.sqrt({x})"
    return f"tl.exp({v!r} * tl.log({x}))"


def uses_index(chain: list[dict]) -> bool:
    """Whether a step needs each element's row and column (row_idx, col_idx in the kernel)."""
    return any(step.get("op") in INDEXED or (step.get("op") == "fork" and uses_index(step["left"] + step["right"]))
               for step in chain)


def kept_band(chain: list[dict]) -> tuple[int | None, int | None]:
    """(lo, hi): the diagonals col - row that the top-level tril / triu steps of `chain` keep
    (lo <= col - row <= hi; None where no step bounds that side).  A step inside a fork zeroes only
    its branch, so it bounds nothing here."""
    lo = max((int(s["value"]) for s in chain if s.get("op") == "triu"), default=None)
    hi = min((int(s["value"]) for s in chain if s.get("op") == "tril"), default=None)
    return lo, hi


def zeroed_tile(chain: list[dict], rows: tuple[str, str], cols: tuple[str, str]) -> str | None:
    """A Triton condition, true when the tril / triu steps of `chain` (kept_band) zero every
    element of the tile whose rows run rows[0]..rows[1] and columns cols[0]..cols[1] (inclusive
    bounds as expressions), or None without such a step.  The steps before them are then discarded
    on that tile (tl.where keeps 0 whatever they gave), so a kernel may skip the tile's work."""
    lo, hi = kept_band(chain)
    parts = ([f"({cols[0]} - ({rows[1]}) > {hi})"] if hi is not None else []) + \
        ([f"({cols[1]} - ({rows[0]}) < {lo})"] if lo is not None else [])
    return " | ".join(parts) or None


def kept_share(chain: list[dict], m: int, n: int) -> float:
    """The share of an [m, n] matrix's elements that the tril / triu steps of `chain` keep (1.0
    without them): the work a kernel skipping zeroed tiles still does, roughly."""
    if not m * n:
        return 1.0
    lo, hi = kept_band(chain)
    lo, hi = max(-(m - 1), lo if lo is not None else -m), min(n - 1, hi if hi is not None else n)
    return sum(min(m, n - d) - max(0, -d) for d in range(lo, hi + 1)) / (m * n)


def error_gain(step: dict, y: str | None = None) -> str | None:
    """The torch expression of the error scale after `step` (ERROR_GAIN formatted for it), or
    None when the step passes an error on at most unchanged.  A fork's gain is its measured
    slope: a central difference at a thousandth of the error scale s, in float64."""
    if step.get("pre") and y is not None:   # the operand as the step sees it
        y = f"({torch_expr(step['pre'], y, {})})"
    if step["op"] in ("fork", "select"):
        h = "(1e-3 * s + 1e-300)"
        up, down = torch_expr([step], f"(x + {h})", {}), torch_expr([step], f"(x - {h})", {})
        return f"({up} - {down}).abs() / (2 * {h}) * s"
    gain = ERROR_GAIN.get(step["op"])
    return gain.format(v=step.get("value"), y=y) if gain else None


# The torch side of a periodic step; reference sources that use one include it.
PERIODIC_SOURCE = '''
def _periodic(f, x, y, every, period):
    """f(x, y) where element i of x meets y[(i // every) % period] (a broadcast operand)."""
    n = x.numel()
    if n % (every * period) == 0:  # a true broadcast: a view, as eager PyTorch does it
        return f(x.reshape(-1, period, every), y.reshape(period, 1)).reshape(x.shape)
    idx = torch.arange(n, device=x.device).div(every, rounding_mode="floor") % period
    return f(x, y.reshape(-1)[idx].reshape(x.shape))
'''


def param_chain(params: dict, key: str, operand_free: str | None = None) -> list[dict]:
    """params[key] (a prologue or epilogue; [] when absent), checked as a chain; `operand_free`
    names the op whose template applies it to x alone, refusing steps that read a tensor."""
    chain = params.get(key, [])
    if not isinstance(chain, list) or not all(isinstance(s, dict) for s in chain):
        raise ValueError(f"params {key!r} must be a list of steps like {{'op': 'relu'}}")
    validate_chain(chain)
    if operand_free and operands(chain):
        raise ValueError(f"{operand_free} {key}s take no operands (steps on x alone, like relu or scale)")
    return chain


def validate_chain(chain: list[dict], indexed: bool = False) -> None:
    """ValueError with the reason when `chain` is not valid; `indexed`: the kernel gives steps
    each element's row and column (tril, triu)."""
    for step in chain:
        op = step.get("op")
        if op not in all_ops():
            raise ValueError(f"unknown pointwise op {op!r}; known: {', '.join(sorted(all_ops()))}")
        if takes_value(op) and op in MASKED and isinstance(step.get("value"), float) and math.isnan(step["value"]):
            raise ValueError(f"{op} with a NaN fill value is not served")
        if takes_value(op) and (isinstance(step.get("value"), bool) or not isinstance(step.get("value"), (int, float))):
            raise ValueError(f"pointwise op {op!r} needs a numeric 'value'")
        for key in EXTRA.get(op, {}):
            if key in step and (isinstance(step[key], bool) or not isinstance(step[key], (int, float))):
                raise ValueError(f"pointwise op {op!r} needs a numeric {key!r}")
        if op in ("elu", "celu", "softplus") and step["value"] == 0:
            raise ValueError(f"{op} with {'beta' if op == 'softplus' else 'alpha'} 0 is undefined")
        if op in INDEXED and not indexed:
            raise ValueError(f"{op} needs each element's row and column: it fuses into a matmul epilogue only")
        if op in INDEXED and step["value"] != int(step["value"]):
            raise ValueError(f"{op} takes an integer diagonal, got {step['value']!r}")
        if op == "fork":
            _validate_fork(step, indexed)
        if op == "select":
            _validate_select(step, indexed)
        if "pre" in step:
            _validate_branch(step, "pre", indexed)
            if op not in BINARY:
                raise ValueError(f"only two-operand steps transform their operand first; got {step}")
        if "every" in step or "period" in step:
            ints = [step.get(k) for k in ("every", "period")]
            if (op not in BINARY and op not in MASKED) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in ints):
                raise ValueError(f"a periodic operand needs a two-operand op and positive integers "
                                 f"'every' and 'period'; got {step}")
        if "scalar" in step and (step["scalar"] is not True or (op not in BINARY and op not in MASKED)
                                 or is_periodic(step)):
            raise ValueError(f"a one-value operand ('scalar': true) goes with a two-operand op and is not "
                             f"periodic; got {step}")


def _validate_fork(step: dict, indexed: bool) -> None:
    if step.get("binop") not in FORK_BINOPS:
        raise ValueError(f"a fork step's binop must be one of {', '.join(FORK_BINOPS)}; got {step.get('binop')!r}")
    for side in ("left", "right"):
        _validate_branch(step, side, indexed)


def _validate_branch(step: dict, side: str, indexed: bool) -> None:
    """A sub-chain of a fork, select or operand ("pre"): operand-free steps."""
    sub = step.get(side)
    if not isinstance(sub, list) or not all(isinstance(s, dict) for s in sub):
        raise ValueError(f"a {step['op']} step's {side!r} must be a list of steps")
    if any(operand_kind(s) for s in sub):
        raise ValueError(f"a {step['op']} step's {side!r} reads no other tensor")
    validate_chain(sub, indexed)


def _validate_select(step: dict, indexed: bool) -> None:
    if step.get("cmp") not in CMP:
        raise ValueError(f"a select step compares with one of {', '.join(CMP)}; got {step.get('cmp')!r}")
    _validate_branch(step, "cond", indexed)
    for side in ("then", "else"):
        v = step.get(side)
        if isinstance(v, bool) or not isinstance(v, (int, float, list)):
            raise ValueError(f"a select step's {side!r} is a list of steps or a number; got {v!r}")
        if isinstance(v, list):
            _validate_branch(step, side, indexed)


def is_periodic(step: dict) -> bool:
    return "period" in step


def is_scalar(step: dict) -> bool:
    return step.get("scalar") is True


def operand_kind(step: dict) -> str | None:
    """"full" for an [M, N] operand, "vector" for an [N] one, "periodic" for a broadcast one
    of step["period"] values, "scalar" for one value, None for no operand."""
    if step["op"] in BINARY or step["op"] in MASKED:
        return "scalar" if is_scalar(step) else "periodic" if is_periodic(step) else "full"
    if step["op"] in VECTOR:
        return "vector"
    return None


def operands(chain: list[dict]) -> list[tuple[str, str]]:
    """(input name, kind) for each step that reads an operand, in chain order."""
    out = []
    for i, step in enumerate(chain):
        kind = operand_kind(step)
        if kind:
            out.append((f"{step['op']}{i}", kind))
    return out


def _expr(table_index: int, chain: list[dict], x: str, operand_names: dict[int, str]) -> str:
    for i, step in enumerate(chain):
        op = step["op"]
        if op in UNARY:
            x = UNARY[op][table_index].format(x=x)
        elif op in SCALAR or op in INDEXED:
            extra = {k: repr(float(step.get(k, d))) for k, d in EXTRA.get(op, {}).items()}
            table = SCALAR if op in SCALAR else INDEXED
            x = table[op][table_index].format(x=x, v=repr(float(step["value"])), **extra)
        elif op == "pow":
            x = pow_expr(x, float(step["value"])) if table_index == 0 else f"torch.pow({x}, {float(step['value'])!r})"
        elif op == "fork":
            left, right = (_expr(table_index, step[k], x, {}) for k in ("left", "right"))
            x = BINARY[step["binop"]][table_index].format(x=left, y=right)
        elif op == "select":
            x = _select_expr(table_index, step, x)
        elif (op in BINARY or op in MASKED) and is_periodic(step) and table_index == 1:
            f = _two(op, step, "a", "b", 1)
            y = _expr(1, step.get("pre", []), operand_names[i], {})
            x = f"_periodic(lambda a, b: {f}, {x}, {y}, {step['every']}, {step['period']})"
        elif op in BINARY or op in MASKED:
            x = _two(op, step, x, _expr(table_index, step.get("pre", []), operand_names[i], {}), table_index)
        else:
            x = VECTOR[op][table_index].format(x=x, y=operand_names[i])
    return x


def _two(op: str, step: dict, x: str, y: str, table_index: int) -> str:
    if op in MASKED:
        return MASKED[op][table_index].format(x=x, y=y, v=number(step["value"]))
    return BINARY[op][table_index].format(x=x, y=y)


def _select_expr(table_index: int, step: dict, x: str) -> str:
    cond = f"({_expr(table_index, step['cond'], x, {})} {CMP[step['cmp']]} {number(step['value'])})"
    then, other = (_expr(table_index, step[k], x, {}) if isinstance(step[k], list) else number(step[k])
                   for k in ("then", "else"))
    if table_index == 0:
        return f"tl.where({cond}, {then}, {other})"
    # torch.where takes Python numbers for either branch; the result keeps x's dtype
    return f"torch.where({cond}, {then}, {other})"


def operand_dtype(step: dict) -> str | None:
    """An operand's dtype when it is not the kernel's: a mask step reads a bool tensor."""
    return "bool" if step["op"] in MASKED else None


def operand_arg(step: dict) -> dict:
    """TensorArg keywords of an operand's input beyond its shape: a mask is a random bool tensor."""
    return {"dtype": "bool", "init": "mask"} if operand_dtype(step) else {}


def triton_expr(chain: list[dict], x: str, operand_names: dict[int, str]) -> str:
    """Triton expression applying `chain` to fp32 value `x`; operand_names maps a step's index
    to the (already loaded, fp32) variable holding its operand."""
    return _expr(0, chain, x, operand_names)


def torch_expr(chain: list[dict], x: str, operand_names: dict[int, str]) -> str:
    return _expr(1, chain, x, operand_names)


def periodic_offsets(step: dict, flat: str) -> str:
    """Triton offsets of a periodic operand for the elements at flat (row-major) index `flat`."""
    index = f"({flat})" if step["every"] == 1 else f"(({flat}) // {step['every']})"
    return f"{index} % {step['period']}"


def uses_periodic(chain: list[dict]) -> bool:
    return any(is_periodic(step) for step in chain)


def operand_shape(step: dict, full: tuple = ("M", "N"), vector: tuple = ("N",)) -> tuple:
    """The TensorArg shape of an operand step's input: `full` (the output's shape), `vector` (a
    last-dim vector's), its `period` values, or one value."""
    return {"full": full, "vector": vector, "periodic": (step.get("period"),), "scalar": (1,)}[operand_kind(step)]


def operand_load(name: str, step: dict, offs: str | None = None, mask: str | None = None,
                 other: str | None = "0.0") -> str:
    """The Triton line loading step's operand `name` (from `name`_ptr) as fp32: the elements at
    `offs` under `mask` (`other` in masked-off lanes, none when None), or a one-value operand
    once (no offsets), a scalar the step broadcasts over the tile: no full-size copy of it, no
    load per element."""
    if is_scalar(step):
        return f"{name} = tl.load({name}_ptr).to(tl.float32)  # one value for every element"
    fill = "" if other is None else f", other={other}"
    return f"{name} = tl.load({name}_ptr + {offs}, mask={mask}{fill}).to(tl.float32)"


def reference_helpers(chain: list[dict]) -> str:
    """Source a reference of `chain` needs besides torch (the periodic-operand helper), or ""."""
    return PERIODIC_SOURCE.lstrip("\n") + "\n\n" if uses_periodic(chain) else ""


def describe_chain(chain: list[dict]) -> str:
    parts = []
    for step in chain:
        if step["op"] == "fork":
            left, right = (describe_chain(step[k]) if step[k] else "x" for k in ("left", "right"))
            parts.append(f"{step['binop']}({left}, {right})")
            continue
        if step["op"] == "select":
            then, other = ((describe_chain(step[k]) if step[k] else "x") if isinstance(step[k], list) else step[k]
                           for k in ("then", "else"))
            cond = describe_chain(step["cond"]) if step["cond"] else "x"
            parts.append(f"where({cond} {CMP[step['cmp']]} {step['value']}, "
                         f"{then}, {other})")
            continue
        pre = f"[{describe_chain(step['pre'])} of the operand]" if step.get("pre") else ""
        if is_periodic(step):
            parts.append(f"{step['op']}{pre}(broadcast of {step['period']})")
            continue
        if is_scalar(step):
            parts.append(f"{step['op']}{pre}(one value)")
            continue
        if pre:
            parts.append(f"{step['op']}{pre}")
            continue
        parts.append(f"{step['op']}({step['value']})" if "value" in step else step["op"])
    return " -> ".join(parts) if parts else "identity"
