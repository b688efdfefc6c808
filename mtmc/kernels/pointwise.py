"""The pointwise op vocabulary shared by elementwise chains and fused epilogues.

A chain is a list of steps, each a dict: {"op": NAME} plus "value" for scalar steps.  Every op
has a Triton expression (computed in fp32 inside kernels) and a torch expression (the reference,
run in float64 by the verifier and in the native dtype for eager timing).  Operand steps read a
second tensor: "bias" a vector over the last dim N, the binary ops a full [M, N] tensor, or,
with "every" and "period" in the step, a broadcast ("periodic") operand of `period` values:
element i of x (row-major over the whole tensor) meets operand[(i // every) % period].  That is
how a [C, 1, 1] bias or an [S, S] mask broadcasts over a larger tensor, read in place instead
of expanded to full size.
"""
from __future__ import annotations

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
}
# name -> (triton, torch); {v} is the step's scalar "value".
SCALAR = {
    "scale": ("({x} * {v})", "({x} * {v})"),
    "shift": ("({x} + {v})", "({x} + {v})"),
    "leaky_relu": ("tl.where({x} >= 0.0, {x}, {x} * {v})", "torch.nn.functional.leaky_relu({x}, {v})"),
    "clamp_min": ("tl.maximum({x}, {v})", "torch.clamp({x}, min={v})"),
    "clamp_max": ("tl.minimum({x}, {v})", "torch.clamp({x}, max={v})"),
}
# name -> (triton, torch); {y} is the operand tensor's value.
BINARY = {
    "residual": ("({x} + {y})", "({x} + {y})"),
    "add": ("({x} + {y})", "({x} + {y})"),
    "sub": ("({x} - {y})", "({x} - {y})"),
    "mul": ("({x} * {y})", "({x} * {y})"),
    "maximum": ("tl.maximum({x}, {y})", "torch.maximum({x}, {y})"),
    "minimum": ("tl.minimum({x}, {y})", "torch.minimum({x}, {y})"),
}
# "bias" adds a vector over the last dim; its operand is [N].
VECTOR = {"bias": ("({x} + {y})", "({x} + {y})")}

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "leaky_relu")

# Local bounds on |d step / d x| (how an error in x grows through a step), as torch expressions
# of the pre-step value x, the error scale s, the operand {y} and the step's {v}; steps not
# listed pass an error on at most unchanged.  Error scales of fused epilogues are built on it.
ERROR_GAIN = {
    "gelu": "1.13 * s", "gelu_tanh": "1.13 * s", "silu": "1.1 * s", "sigmoid": "0.25 * s",
    "exp": "torch.exp(x) * s", "square": "(2 * x.abs() + s) * s",
    "scale": "abs({v}) * s", "leaky_relu": "max(1.0, abs({v})) * s", "mul": "s * {y}.abs()",
}


def all_ops() -> set[str]:
    return set(UNARY) | set(SCALAR) | set(BINARY) | set(VECTOR)


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


def validate_chain(chain: list[dict]) -> None:
    for step in chain:
        op = step.get("op")
        if op not in all_ops():
            raise ValueError(f"unknown pointwise op {op!r}; known: {', '.join(sorted(all_ops()))}")
        if op in SCALAR and not isinstance(step.get("value"), (int, float)):
            raise ValueError(f"pointwise op {op!r} needs a numeric 'value'")
        if "every" in step or "period" in step:
            ints = [step.get(k) for k in ("every", "period")]
            if op not in BINARY or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in ints):
                raise ValueError(f"a periodic operand needs a two-operand op and positive integers "
                                 f"'every' and 'period'; got {step}")


def is_periodic(step: dict) -> bool:
    return "period" in step


def operand_kind(step: dict) -> str | None:
    """"full" for an [M, N] operand, "vector" for an [N] one, "periodic" for a broadcast one
    of step["period"] values, None for no operand."""
    if step["op"] in BINARY:
        return "periodic" if is_periodic(step) else "full"
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
        elif op in SCALAR:
            x = SCALAR[op][table_index].format(x=x, v=repr(float(step["value"])))
        elif op in BINARY and is_periodic(step) and table_index == 1:
            f = BINARY[op][1].format(x="a", y="b")
            x = f"_periodic(lambda a, b: {f}, {x}, {operand_names[i]}, {step['every']}, {step['period']})"
        elif op in BINARY:
            x = BINARY[op][table_index].format(x=x, y=operand_names[i])
        else:
            x = VECTOR[op][table_index].format(x=x, y=operand_names[i])
    return x


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


def operand_shape(step: dict) -> tuple:
    """The TensorArg shape of an operand step's input: [M, N], [N], or its `period` values."""
    return {"full": ("M", "N"), "vector": ("N",), "periodic": (step.get("period"),)}[operand_kind(step)]


def reference_helpers(chain: list[dict]) -> str:
    """Source a reference of `chain` needs besides torch (the periodic-operand helper), or ""."""
    return PERIODIC_SOURCE.lstrip("\n") + "\n\n" if uses_periodic(chain) else ""


def describe_chain(chain: list[dict]) -> str:
    parts = []
    for step in chain:
        if is_periodic(step):
            parts.append(f"{step['op']}(broadcast of {step['period']})")
            continue
        parts.append(f"{step['op']}({step['value']})" if "value" in step else step["op"])
    return " -> ".join(parts) if parts else "identity"
