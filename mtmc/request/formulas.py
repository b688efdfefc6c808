"""Phase 4 of reading a request: formulas ("relu(x + y)", "x @ W^T + b") parsed into a tree and
walked into the core op and its pointwise steps."""
from __future__ import annotations

import math

from mtmc.kernels import pointwise
from mtmc.request.reading import DEFAULT_LEAKY_SLOPE, MATMUL_WORDS, VARS, _Ctx, _Fail, _Item, _rx, _vocabulary


# -- phase 4: formulas ("relu(x + y)", "x @ W^T + b") ----------------------------------------

_TOKEN = (r"\s*(?:(?P<arrow>->)|(?P<num>(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)"
          r"|(?P<name>[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)|(?P<str>'[a-z_]*'|\"[a-z_]*\")"
          r"|(?P<op>\*\*|>=|<=|==|!=|[-+*/@^(),=<>])|(?P<other>\S))")
# comparisons bind loosest: where(x + 1 > 0, ...) compares x + 1
_BIN_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "@": 2, "**": 4, "^": 4,
             ">": 0, "<": 0, ">=": 0, "<=": 0, "==": 0, "!=": 0}
_CMP_NAMES = {sym: name for name, sym in pointwise.CMP.items()}   # ">" -> "gt"
_NAMESPACES = {"torch", "nn", "functional", "f", "math", "tl", "np", "numpy", "triton", "special"}
_BIAS_NAMES = {"b", "bias"}
_RESIDUAL_NAMES = {"r", "res", "residual", "skip", "shortcut"}
_MAIN_NAMES = ("x", "input", "inputs", "inp", "a", "h", "hidden", "logits", "scores", "act")
_UNARY_FUNCS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "swish": "silu", "sigmoid": "sigmoid",
                "tanh": "tanh", "exp": "exp", "abs": "abs", "neg": "neg", "negative": "neg",
                "square": "square", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "reciprocal": "reciprocal",
                "sign": "sign", "erf": "erf", "mish": "mish", "selu": "selu", "hardsigmoid": "hardsigmoid",
                "hardswish": "hardswish", "softsign": "softsign", "logsigmoid": "log_sigmoid",
                "log_sigmoid": "log_sigmoid"}
# one-input functions with a number (x, value) and its keyword and default: softplus(x, beta)
# A^T B: the matmul kernel reads B transposed through its strides (x @ W^T), not A
_TRANSPOSED_LEFT = ("a matmul with its left operand transposed (A^T B) is not written in words: the matmul "
                    "kernel reads a transposed B (x @ W^T) but not a transposed A; ask for B^T A and transpose "
                    "the result, or upload the module (a module's A.T @ B is served)")
_VALUE_FUNCS = {"softplus": ("beta", 1.0), "elu": ("alpha", 1.0), "celu": ("alpha", 1.0)}
_CORE_FUNCS = {"softmax": ("softmax", "softmax"), "log_softmax": ("softmax", "log_softmax"),
               "logsoftmax": ("softmax", "log_softmax"), "layer_norm": ("norm", "layernorm"),
               "layernorm": ("norm", "layernorm"), "rms_norm": ("norm", "rmsnorm"),
               "rmsnorm": ("norm", "rmsnorm"), "sum": ("reduction", "sum"), "mean": ("reduction", "mean"),
               "amax": ("reduction", "max"), "amin": ("reduction", "min"), "prod": ("reduction", "prod"),
               "argmax": ("reduction", "argmax"), "argmin": ("reduction", "argmin")}
_BOUND_FUNCS = {"max": "clamp_min", "maximum": "clamp_min", "fmax": "clamp_min",
                "min": "clamp_max", "minimum": "clamp_max", "fmin": "clamp_max"}
_OTHER_FUNCS = {"leaky_relu", "relu6", "hardtanh", "clamp", "clip", "clamp_min", "clamp_max", "linear", "sqrt", "t",
                "transpose", "pow", "where", "norm", "var", "std"}
# Known functions outside the vocabulary: a formula using them fails with a clear reason.
_UNSUPPORTED_FUNCS = {"log1p", "log2", "sin", "cos", "tan", "floor", "ceil", "round", "div", "dropout", "conv2d",
                      "conv1d", "cumsum", "diag", "diagflat", "diag_embed"}
_KNOWN_FUNCS = (set(_UNARY_FUNCS) | set(_VALUE_FUNCS) | set(_CORE_FUNCS) | set(_BOUND_FUNCS) | _OTHER_FUNCS
                | _UNSUPPORTED_FUNCS)
_CONSTANTS = {"pi": math.pi}   # names a formula may use as numbers (math.pi)
_LITERALS = {"true", "false", "none"}   # keyword values (keepdim=True), not tensors


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
        if self.peek("op", "-"):   # -x ** 2 is -(x ** 2), as in Python
            self.i += 1
            return ("neg", self.expr(_BIN_PREC["**"]))
        if self.peek("op", "+"):
            self.i += 1
            return self.unary()
        return self.postfix(self.primary())

    def postfix(self, node):
        while True:
            if self.peek("op", "^") and self.i + 1 < len(self.toks) and self.toks[self.i + 1][1] == "t":
                self.i += 2
                node = ("T", node)
            elif self.peek("other", ".") and node[0] in ("call", "bin") and self.i + 2 < len(self.toks) \
                    and self.toks[self.i + 1][0] == "name" and "." not in self.toks[self.i + 1][1] \
                    and self.toks[self.i + 2][1] == "(":   # x.abs().max(): a method on a call's result
                self.i += 1
                method = self.primary()
                node = ("call", method[1], [node, *method[2]], method[3])
            elif self.peek("other", ".") and node[0] == "call":   # x.max(dim=-1).values / .indices
                field = self.toks[self.i + 1][1] if self.i + 1 < len(self.toks) else ""
                head, _, func = node[1].rpartition(".")
                if field not in ("values", "indices") or func not in ("max", "min"):
                    raise _NoFormula
                self.i += 2
                if field == "indices":
                    node = ("call", (head + "." if head else "") + "arg" + func, node[2], node[3])
            else:
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
        if kind == "op" and text == "(" or kind == "other" and text == "[":
            close = ")" if text == "(" else "]"
            self.i += 1
            items = [self.expr(0)]
            while self.peek("op", ","):   # (1, 2) / [2, 3]: a tuple of dims
                self.i += 1
                if self.peek("op", close) or self.peek("other", close):
                    break
                items.append(self.expr(0))
            if not (self.peek("op", close) or self.peek("other", close)):
                raise _NoFormula
            self.i += 1
            return items[0] if len(items) == 1 and text == "(" else ("tuple", items)
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
        # a constant written as a tensor: zeros_like(x), torch.tensor(0.0), full_like(x, 2) are numbers
        const = {"zeros_like": 0.0, "ones_like": 1.0}.get(parts[-1]) if len(parts) == 1 and len(args) == 1 else None
        if parts[-1] in ("full_like", "tensor", "scalar_tensor") and len(parts) == 1 and args:
            const = _const(args[-1])
        if const is not None and not kwargs:
            return ("num", float(const))
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
    names, calls = _tensor_names(node), _leaves(node, "call")
    return (bool(names) and all(_rx(rf"(?:{VARS})").fullmatch(n) for n in names)
            and all(c in _KNOWN_FUNCS for c in calls))


def _tensor_names(node) -> list[str]:
    """The names a formula reads, without the constants it names (math.pi)."""
    return [n for n in _leaves(node, "name") if n not in _CONSTANTS and n not in _LITERALS]


def _tokens(text: str) -> list[tuple[str, str, int, int]]:
    toks = []
    for m in _rx(_TOKEN).finditer(text):
        kind = m.lastgroup
        toks.append((kind, m.group(kind), m.start(kind), m.end(kind)))
    return toks


def _read_formulas(ctx: _Ctx) -> None:
    toks = _tokens(ctx.s)
    parser = _FormulaParser(toks)
    matmul_said = bool(_rx(rf"\b{MATMUL_WORDS}\b").search(ctx.s))
    i = 0
    while i < len(toks):
        try:
            node = _resolve(parser.parse_at(i))
        except _NoFormula:
            node = None
        if node is not None and matmul_said:
            node = _star_as_matmul(node)
        if node is None or not _is_formula(node):
            i += 1
            continue
        if parser.i < len(toks) and toks[parser.i][1] == "[":
            raise _Fail("indexing inside a formula (v[:, None], x[..., 0]) is not read in words: say the "
                        "operand's shape instead ('a bias of 4096'), or upload the module")
        start, end = toks[i][2], toks[parser.i - 1][3]
        ctx.s = ctx.s[:start] + " " * (end - start) + ctx.s[end:]
        ctx.note("formula", ctx.norm[start:end])
        _formula_items(ctx, node, start, end)
        i = parser.i


def _star_as_matmul(node):
    """"C = A * B ... (matrix multiplication)": where the request names a matrix product and its
    formula has no @, a * between two tensor names is that product, not an elementwise mul."""
    def names(n) -> bool:
        return n[0] == "name" and n[1] not in _CONSTANTS or (n[0] == "T" and names(n[1]))

    def has_at(n) -> bool:
        return (n[0] == "bin" and n[1] == "@") or any(has_at(c) for c in _children(n))

    def swap(n):
        if n[0] == "bin" and n[1] == "*" and names(n[2]) and names(n[3]):
            return ("bin", "@", n[2], n[3])
        if n[0] == "bin":
            return ("bin", n[1], swap(n[2]), swap(n[3]))
        return n
    return node if has_at(node) else swap(node)


def _formula_items(ctx: _Ctx, node, start: int, end: int) -> None:
    """Items for a formula, in application order; steps before its core op apply to the input."""
    names = _tensor_names(node)
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
            self.fail(node, _TRANSPOSED_LEFT if node[1][0] == "name" else
                      "a transpose only fits the weight of a matmul (x @ W^T)")
        self.fail(node, "this does not read the input tensor")

    def matmul(self, a, b) -> tuple:
        for side in (a, b):
            if side[0] == "call" and side[1] in ("diag", "diagflat", "diag_embed"):
                self.fail(side, "a product with a diagonal matrix is a scaling of B's rows (diag(v) @ B) or "
                                "columns (B @ diag(v)); it is not written in words: upload the module (its "
                                "torch.diag(v) @ B runs as one elementwise kernel)")
        if a[0] == "T":
            self.fail(a, _TRANSPOSED_LEFT)
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
        if op == "/" and not in_left and value:   # c / f(x): its reciprocal, scaled (1 / sqrt(x) is rsqrt)
            if chain and chain[-1] == ("step", {"op": "sqrt"}):
                chain = chain[:-1] + [("step", {"op": "rsqrt"})]
            else:
                chain = chain + [("step", {"op": "reciprocal"})]
            return chain + ([("step", {"op": "scale", "value": value})] if value != 1 else [])
        if op == "/" and value is None:   # x / y, or y / x: a second tensor divides or is divided
            return chain + [("step", self.operand(other, "div" if in_left else "rdiv"))]
        if op in ("**", "^") and in_left and value is not None and not in_right:
            return chain + [("step", {"op": "square"} if value == 2 else {"op": "pow", "value": value})]
        if op in _CMP_NAMES:
            self.fail(node, "a comparison makes a bool mask, and these kernels write float values: put it in "
                            "where(x > 0, x, 0.1 * x)")
        self.fail(node, "the pointwise vocabulary has no op for this (no tensor exponents)")

    def plus(self, other, value) -> tuple:
        if value is not None:
            return ("step", {"op": "shift", "value": value})
        name, pre = self.operand_pre(other)
        op = "add" if pre else "bias" if name in _BIAS_NAMES else "residual" if name in _RESIDUAL_NAMES else "add"
        return ("step", {"op": op, **({"pre": pre} if pre else {})})

    def operand(self, other, op: str) -> dict:
        _, pre = self.operand_pre(other)
        return {"op": op, **({"pre": pre} if pre else {})}

    def operand_pre(self, other) -> tuple[str, list[dict]]:
        """(the tensor, the steps applied to it first) of a second operand: y, or relu(y),
        sigmoid(y) * 2 ... (one kernel for a formula of two tensors)."""
        names = _leaves(other, "name")
        if other[0] == "name" or len(set(names)) != 1:
            return self.operand_name(other), []
        entries = _Walker(names[0], self.ctx).walk(other)
        pre = [e[1] for e in entries]
        if any(e[0] != "step" or pointwise.operand_kind(e[1]) for e in entries):
            self.fail(other, "a second operand takes one-input steps only")
        return names[0], pre

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
                # x * sigmoid(c * x) (the quick GELU has c = 1.702) = silu(c * x) / c
                c = _scaled_by(b[2][0], a) if b[0] == "call" and b[1] == "sigmoid" and len(b[2]) == 1 \
                    and not b[3] else None
                if c:
                    return self.walk(a) + [("step", {"op": "scale", "value": c}), ("step", {"op": "silu"}),
                                           ("step", {"op": "scale", "value": 1.0 / c})]
        vector_norm = _vector_norm_form(node, self.main)   # x / x.norm(p=2, dim=-1, keepdim=True) ...
        if vector_norm:
            return [("core", "norm", vector_norm)]
        eps = _rms_form(node, self.main)   # x * rsqrt(mean(x ** 2, -1, keepdim=True) + eps): RMSNorm
        if eps is not None:
            self.ctx.value("eps", eps)
            self.ctx.flags.add("no_affine")   # no weight written: a "* w" after it is an epilogue step
            return [("core", "norm", "rmsnorm")]
        # a known activation written out (x * tanh(softplus(x)), 0.5 * x * (1 + erf(x / sqrt(2)))):
        # found by its values, as the vocabulary's one-input op (times a number) it equals
        steps = _written_out(node, self.main)
        if steps is not None:
            return [("step", s) for s in steps]
        self.fail(node, "it uses the input twice in a way the pointwise vocabulary has no op for")

    def where(self, node) -> list:
        """where(f(x) CMP c, then, else): one select step, each branch a number or steps on x."""
        _, _, args, kwargs = node
        if len(args) != 3 or kwargs:
            self.fail(node, "where takes a condition and two values")
        cond, *branches = args
        if cond[0] != "bin" or cond[1] not in _CMP_NAMES:
            self.fail(cond, "the condition must compare the input with a number (x > 0)")
        cmp, left, right = _CMP_NAMES[cond[1]], cond[2], cond[3]
        if _const(left) is not None and _const(right) is None:   # 0 < x is x > 0
            cmp, left, right = pointwise.CMP_FLIPPED[cmp], right, left
        value = _const(right)
        if value is None or not self.has_input(left):
            self.fail(cond, "the condition must compare the input with a number (x > 0)")
        step = {"op": "select", "cond": self.steps_of(left), "cmp": cmp, "value": value}
        for key, branch in zip(("then", "else"), branches):
            number = _const(branch)
            step[key] = number if number is not None else self.steps_of(branch)
        return [("step", step)]

    def steps_of(self, node) -> list[dict]:
        """The one-input steps a branch applies to x (no second tensor, no core op)."""
        if not self.has_input(node):
            self.fail(node, "each branch of where is a number or a function of the input")
        entries = self.walk(node)
        if any(e[0] != "step" or pointwise.operand_kind(e[1]) for e in entries):
            self.fail(node, "a branch of where takes one-input steps only")
        return [e[1] for e in entries]

    def call(self, node) -> list:
        _, name, args, kwargs = node
        if name == "where":
            return self.where(node)
        if name in ("var", "std") and args and self.has_input(args[0]):   # torch.std is var, then sqrt
            unbiased = kwargs.get("unbiased", ("name", "true"))
            correction = _const(kwargs["correction"]) if "correction" in kwargs else float(unbiased == ("name", "true"))
            if correction not in (0.0, 1.0):
                self.fail(node, "var and std take unbiased=True / False (correction 1 or 0)")
            if correction == 0.0:
                self.ctx.flags.add("population")
            core = self.core(("call", "var", args, {k: v for k, v in kwargs.items()
                                                    if k not in ("unbiased", "correction")}))
            return self.walk(args[0]) + [core] + ([("step", {"op": "sqrt"})] if name == "std" else [])
        if name == "norm":
            self.fail(node, "a vector norm is served as x divided by it (x / x.norm(p=2, dim=-1, keepdim=True), "
                            "x / torch.norm(x)), or in words ('the L2 norm of each row')")
        if name in _UNSUPPORTED_FUNCS:
            self.fail(node, f"{name} is not in the pointwise vocabulary ({_vocabulary()})")
        if name == "linear":   # F.linear(x, w[, b]) = x @ w^T (+ b)
            self.ctx.flags.add("nk")
            return [("core", "matmul", "matmul")] + ([("step", {"op": "bias"})] if len(args) > 2 else [])
        if not args:
            self.fail(node, "it has no input")
        if self.has_input(args[0]) and _uses_input_twice(args[0], self.main):
            steps = _written_out(node, self.main)   # tanh(softplus(x)) * x is one op, not two
            if steps is not None:
                return [("step", s) for s in steps]
        inner = self.walk(args[0])
        if name in _VALUE_FUNCS:
            key, default = _VALUE_FUNCS[name]
            value = _const(kwargs.get(key, args[1] if len(args) > 1 else ("num", default)))
            if value is None or (name == "softplus" and value == 0):
                self.fail(node, f"its {key} must be a non-zero number")
            extra = {"threshold": _const(kwargs.get("threshold", args[2] if len(args) > 2 else ("num", 20.0)))} \
                if name == "softplus" else {}
            if None in extra.values():
                self.fail(node, "its threshold must be a number")
            return inner + [("step", {"op": name, "value": value, **extra})]
        if name == "pow":
            exponent = _const(args[1]) if len(args) > 1 else None
            if exponent is None:
                self.fail(node, "the exponent must be a number")
            return inner + [("step", {"op": "square"} if exponent == 2 else {"op": "pow", "value": exponent})]
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
        if dim is not None and dim[0] == "tuple" and family == "reduction":   # dim=(2, 3): several dims
            dims = [_const(d) for d in dim[1]]
            if any(d is None or d != int(d) for d in dims):
                self.fail(node, "the dims must be numbers")
            self.ctx.reduce_dim = [int(d) for d in dims]
        elif dim is not None:
            value = _const(dim)
            if value is None or value != int(value):
                self.fail(node, "the dim must be a number" + (" (several dims: sums, means and other reductions only)"
                                                              if dim[0] == "tuple" else ""))
            self.ctx.reduce_dim = int(value)
        elif family == "reduction":   # torch.sum(x), x.mean(): PyTorch reduces every element (was the last dim)
            self.ctx.reduce_dim = "all elements"
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
        if name == "hardtanh":
            lo = _const(kwargs.get("min_val", args[1] if len(args) > 1 else ("num", -1.0)))
            hi = _const(kwargs.get("max_val", args[2] if len(args) > 2 else ("num", 1.0)))
            if lo is not None and hi is not None:
                return [{"op": "clamp_min", "value": lo}, {"op": "clamp_max", "value": hi}]
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
    if kind == "name" and node[1] in _CONSTANTS:
        return _CONSTANTS[node[1]]
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
    if kind == "tuple":
        return "(" + ", ".join(_show(a) for a in node[1]) + ")"
    args = [_show(a) for a in node[2]] + [f"{k}={_show(v)}" for k, v in node[3].items()]
    return f"{node[1]}({', '.join(args)})"


# -- activations written out, recognised by their values --------------------------------------

_PROBE = (-8.0, 8.0, 801)   # where a written-out formula is compared with the vocabulary's ops


def _row_call(node, name: str) -> list | None:
    """The arguments of name(arg, dim=-1, keepdim=True) (dim and keepdim by keyword or position)."""
    if node[0] != "call" or node[1] != name or not node[2]:
        return None
    _, _, args, kwargs = node
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    keep = kwargs.get("keepdim", args[2] if len(args) > 2 else None)
    return args if dim is not None and _const(dim) == -1 and keep == ("name", "true") else None


def _vector_norm_form(node, main: str) -> str | None:
    """x divided by its row's L2 or L1 norm (norm(x, p, dim=-1, keepdim=True), sqrt(sum(x^2)),
    sum(abs(x))) or by its Frobenius norm (torch.norm(x), p='fro'): the norm family's op, else None."""
    x = ("name", main)
    if node[1] != "/" or node[2] != x:
        return None
    d = node[3]
    if d[0] == "call" and d[1] == "norm" and d[2] and d[2][0] == x:
        p = d[3].get("p", d[2][1] if len(d[2]) > 1 else ("num", 2.0))
        if "dim" not in d[3] and len(d[2]) <= 2 and p in (("num", 2.0), ("str", "fro")):
            return "frobenius"
        row = _row_call(("call", "norm", [x, ("num", 0.0)], d[3]), "norm") if len(d[2]) == 1 else None
        return {("num", 2.0): "l2norm", ("num", 1.0): "l1norm"}.get(p) if row else None
    summed = _row_call(d[2][0], "sum") if d[0] == "call" and d[1] == "sqrt" and len(d[2]) == 1 else None
    if summed and _is_square(summed[0], x):
        return "l2norm"
    summed = _row_call(d, "sum")
    return "l1norm" if summed and summed[0] == ("call", "abs", [x], {}) else None


def _rms_form(node, main: str) -> float | None:
    """eps of an RMSNorm written out over the last dim (x * rsqrt(mean(x^2, -1, keepdim) + eps),
    x / sqrt(...), either order, eps optional: 0.0), else None."""
    x = ("name", main)
    _, op, left, right = node
    if op == "*":
        root = right if left == x else left if right == x else None
        inner = root[2][0] if root and root[0] == "call" and root[1] == "rsqrt" and len(root[2]) == 1 else None
    elif op == "/" and left == x:
        inner = right[2][0] if right[0] == "call" and right[1] == "sqrt" and len(right[2]) == 1 else None
    else:
        return None
    eps = 0.0
    if inner is not None and inner[0] == "bin" and inner[1] == "+":
        for a, b in ((inner[2], inner[3]), (inner[3], inner[2])):
            if _const(b) is not None:
                inner, eps = a, _const(b)
                break
    meaned = _row_call(inner, "mean") if inner is not None else None
    return eps if meaned and _is_square(meaned[0], x) else None


def _is_square(node, x) -> bool:
    """node is x squared: x ** 2, x * x, square(x) or pow(x, 2)."""
    return (node in (("bin", "**", x, ("num", 2.0)), ("bin", "*", x, x), ("call", "square", [x], {}))
            or (node[0] == "call" and node[1] == "pow" and node[2] == [x, ("num", 2.0)]))


def _scaled_by(node, x) -> float | None:
    """c where node is c * x or x * c (c a non-zero number), else None."""
    if node[0] != "bin" or node[1] != "*":
        return None
    for k, v in ((node[2], node[3]), (node[3], node[2])):
        if k[0] == "num" and v == x and k[1] != 0:
            return float(k[1])
    return None


def _uses_input_twice(node, main: str) -> bool:
    return _leaves(node, "name").count(main) > 1


def _evaluate(node, main: str, x):
    """The formula's value at the float64 tensor x (the input named `main`), or None where it
    has a part this cannot compute (another tensor, an unknown function)."""
    import torch
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "name":
        return x if node[1] == main else _CONSTANTS.get(node[1])
    if kind == "neg":
        v = _evaluate(node[1], main, x)
        return None if v is None else -v
    if kind == "bin" and node[1] != "@":
        a, b = _evaluate(node[2], main, x), _evaluate(node[3], main, x)
        if a is None or b is None:
            return None
        op = node[1]
        if op in _CMP_NAMES:   # x * (x > 0): the mask as 0 / 1 (it was taken for a power)
            a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
            return getattr(torch, _CMP_NAMES[op])(a, b).to(torch.float64)
        if op not in ("+", "-", "*", "/", "**", "^"):
            return None
        return (a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b if op == "/"
                else torch.pow(torch.as_tensor(a, dtype=torch.float64), b))
    if kind == "call":
        args = [_evaluate(a, main, x) for a in node[2]]
        kwargs = {k: (v[1] if v[0] == "str" else _evaluate(v, main, x)) for k, v in node[3].items()}
        fn = getattr(torch, node[1], None) or getattr(torch.nn.functional, node[1], None)
        if fn is None or any(a is None for a in args) or any(v is None for v in kwargs.values()):
            return None
        args = [torch.as_tensor(a, dtype=torch.float64) if i == 0 else a for i, a in enumerate(args)]
        try:
            return fn(*args, **kwargs)
        except (TypeError, RuntimeError, ValueError):
            return None
    return None


def _written_out(node, main: str) -> list[dict] | None:
    """The vocabulary's one-input op (then a scale, when it is that op times a number) whose
    values equal the formula's over [-8, 8], or None."""
    import torch
    if set(_leaves(node, "call")) & set(_CORE_FUNCS):
        return None   # a reduction over the probe's points is no pointwise value: exp(x) / sum(exp(x))
    x = torch.linspace(*_PROBE, dtype=torch.float64)
    f = _evaluate(node, main, x)
    if not isinstance(f, torch.Tensor) or f.shape != x.shape or not bool(torch.isfinite(f).all()):
        return None
    for op, (_, torch_expr) in pointwise.UNARY.items():
        g = eval(torch_expr.format(x="x"), {"torch": torch, "x": x})   # noqa: S307 (our own table)
        if not bool(torch.isfinite(g).all()):
            continue
        if torch.allclose(f, g, rtol=1e-6, atol=1e-9):
            return [{"op": op}]
        big = g.abs() > 1e-3
        if int(big.sum()) > 10:
            c = float((f[big] / g[big]).median())
            if c != 0 and torch.allclose(f, c * g, rtol=1e-6, atol=1e-9):
                return [{"op": op}, {"op": "scale", "value": c}]
    return None
