"""What each node of a captured graph computes, in the op catalog's terms.

Reads one graph of module.capture's result (plain JSON) and classifies its nodes: *pointwise*
(a unary step of the pointwise vocabulary, or a binary op of two values), *anchors* a kernel is
built around (matmul / linear / bmm, reductions, softmax, layer and RMS norms; plugins add more:
convolutions, module.conv_fusion; pooling, module.pool_fusion), or neither.
Near misses (a softmax with dim=None, dropout in training mode, an in-place op on a shared
tensor) raise Reject with the reason, which the report repeats.  Function targets are matched
by torch.fx's qualified names of the real torch functions, so torch versions agree.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtmc.kernels.spec import DTYPES
from mtmc.module import activations, identities
from mtmc.module.functionalize import changed_elsewhere, storage_family
from mtmc.module.fxjson import arg_nodes, decode_arg, target_name


# -- reading the captured graph ---------------------------------------------------------------

@dataclass(frozen=True)
class NodeRef:
    """An argument that is another node's value."""
    name: str


class _Refs(dict):
    def __missing__(self, name):
        return NodeRef(name)


def _metadata_of(n: dict) -> tuple[str, str] | None:
    """(the node whose metadata `n` reads, what it reads: "device", "shape", "size" ...), if any."""
    args = decode_arg(n["args"], _Refs())
    kind = _metadata_kind(n["op"], n["target"], args) if args and isinstance(args[0], NodeRef) else None
    return (args[0].name, kind) if kind else None


def _metadata_kind(op: str, target, args) -> str | None:
    """What a node reads of its first argument when that is metadata only ("device", "size"), else None."""
    from mtmc.module.shape_facts import META_ATTRS, META_METHODS
    if op == "call_function" and target in ("getattr", "builtins.getattr"):
        return args[1] if len(args) == 2 and args[1] in META_ATTRS else None
    return target if op == "call_method" and target in META_METHODS else None


# metadata a permutation of the dims (a layout change) leaves as it was
LAYOUT_FREE = {"device", "dtype", "ndim", "dim", "numel", "is_cuda", "is_floating_point"}


def metadata_reader(node) -> str | None:
    """The metadata an fx.Node reads of its first argument ("device", "shape", "size", ...), or
    None where it reads data (the assembler's test)."""
    import builtins
    return _metadata_kind(node.op, "getattr" if node.target is builtins.getattr else node.target, node.args)


class Graph:
    """Read-only view of one captured graph: nodes in order, users, values, modules."""

    def __init__(self, desc: dict, data_users: bool = False):
        self.path = desc.get("path", "")
        self.nodes = desc["nodes"]
        self.by_name = {n["name"]: n for n in self.nodes}
        self.order = {n["name"]: i for i, n in enumerate(self.nodes)}
        self.modules = desc.get("modules", {})
        self.line_of = desc.get("line_of", {})
        # data_users (the partitioner's view): `x.device` in `torch.tensor(0.0, device=x.device)` or
        # `x.size(0)` reads only metadata, which a fused kernel's output shares, so it ends no
        # pointwise chain (the assembler points such readers at the group's output, or keeps the
        # producer).  The graph stage's rewrites change values' shapes, so they see every reader.
        self.users: dict[str, list[str]] = {n["name"]: [] for n in self.nodes}
        self.reads_metadata: dict[str, str] = {}   # reader -> what it reads of its first argument
        for n in self.nodes:
            meta = _metadata_of(n)
            if meta:
                self.reads_metadata[n["name"]] = meta[1]
            for used in dict.fromkeys(arg_nodes(n["args"]) + arg_nodes(n["kwargs"])):
                if not (data_users and meta and used == meta[0]):
                    self.users[used].append(n["name"])

    def args(self, name: str) -> tuple[tuple, dict]:
        """The node's (args, kwargs), node arguments as NodeRefs; a function's input passed by
        keyword (torch.relu(input=x)) comes first in args, as every reader expects it there."""
        n = self.by_name[name]
        args, kwargs = tuple(decode_arg(n["args"], _Refs())), decode_arg(n["kwargs"], _Refs())
        if n["op"] == "call_function" and not args and "input" in kwargs:
            args = (kwargs.pop("input"),)
        return args, kwargs

    def layout_free_reader(self, name: str) -> bool:
        """Whether node `name` reads only metadata that a layout change keeps (x.device, x.dim())."""
        return self.reads_metadata.get(name) in LAYOUT_FREE

    def tensor(self, ref) -> tuple[list[int], str] | None:
        """(shape, dtype) when `ref` (a NodeRef or a name) produced a tensor."""
        name = ref.name if isinstance(ref, NodeRef) else ref
        v = self.by_name[name]["value"] if name in self.by_name else None
        if isinstance(v, dict) and "tensor" in v:
            return list(v["tensor"]["shape"]), v["tensor"]["dtype"]
        return None

    def number(self, ref) -> float | None:
        """The Python number a scalar argument is (a literal, or a node that computed one)."""
        if isinstance(ref, bool):
            return None
        if isinstance(ref, (int, float)):
            return float(ref)
        if isinstance(ref, NodeRef):
            v = self.by_name[ref.name]["value"]
            if isinstance(v, dict) and "value" in v:
                x = decode_arg(v["value"], {})
                if isinstance(x, (int, float)) and not isinstance(x, bool):
                    return float(x)
        return None

    def literal(self, ref):
        """The number a 0-d `torch.tensor(number)` node holds (torch.min(x, torch.tensor(0.5)),
        KernelBench L2 31: capture keeps such constants as that call), else `ref` unchanged.  In
        a binop with a tensor a 0-d tensor promotes as the number would."""
        if not isinstance(ref, NodeRef) or ref.name not in self.by_name:
            return ref
        n = self.by_name[ref.name]
        if n["op"] != "call_function" or n["target"] != "torch.tensor":
            return ref
        args, _ = self.args(ref.name)
        value = args[0] if args else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else ref

    def words(self, name: str) -> str:
        """A node in words for reports: what it calls, and its line in the user's file."""
        n = self.by_name[name]
        what = n["target"]
        if n["op"] == "call_module":
            what = f"{self.modules.get(n['target'], {}).get('type', '').rsplit('.', 1)[-1]} {n['target']}"
        elif n["op"] == "call_method":
            what = f".{n['target']}()"
        elif n["op"] == "call_function":
            what = n["target"].removeprefix("torch.nn.functional.").removeprefix("torch._C._nn.")
            what = what.removeprefix("_operator.").removeprefix("torch.").removeprefix("functional.")
        line = self.line_of.get(name)
        return f"{what} (line {line})" if line else what


# -- what each node computes ----------------------------------------------------------------

def q(fn) -> str:
    return target_name(fn)


def _cls(c) -> str:
    return f"{c.__module__}.{c.__qualname__}"


UNARY_FUNCTIONS = {q(f): op for f, op in [
    (torch.relu, "relu"), (F.relu, "relu"), (torch.sigmoid, "sigmoid"), (F.sigmoid, "sigmoid"),
    (torch.tanh, "tanh"), (F.tanh, "tanh"), (torch.exp, "exp"), (torch.abs, "abs"), (torch.neg, "neg"),
    (operator.neg, "neg"), (torch.square, "square"), (F.silu, "silu"), (F.gelu, "gelu"),
    (F.leaky_relu, "leaky_relu"), (torch.clamp, "clamp"), (torch.clip, "clamp"), (F.relu6, "relu6"),
    (F.hardtanh, "hardtanh"), (F.dropout, "dropout"), (torch.pow, "pow"), (operator.pow, "pow"),
    (operator.abs, "abs"), (torch.clamp_min, "clamp_min"), (torch.clamp_max, "clamp_max"),
    (torch.negative, "neg"), (torch.absolute, "abs"),   # torch's aliases
]}
UNARY_METHODS = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "abs": "abs",
                 "neg": "neg", "negative": "neg", "absolute": "abs", "square": "square", "clamp": "clamp",
                 "clip": "clamp", "pow": "pow",
                 "clamp_min": "clamp_min", "clamp_max": "clamp_max", "contiguous": "identity",
                 "clone": "identity", "float": "cast", "half": "cast", "bfloat16": "cast", "to": "cast",
                 "type_as": "cast"}
UNARY_MODULES = {_cls(c): op for c, op in [
    (nn.ReLU, "relu"), (nn.GELU, "gelu"), (nn.SiLU, "silu"), (nn.Sigmoid, "sigmoid"), (nn.Tanh, "tanh"),
    (nn.LeakyReLU, "leaky_relu"), (nn.ReLU6, "relu6"), (nn.Hardtanh, "hardtanh"), (nn.Identity, "identity"),
    (nn.Dropout, "dropout"),
]}
# more activations and pointwise math (module.activations)
UNARY_FUNCTIONS.update(activations.FUNCTIONS)
UNARY_METHODS.update(activations.METHODS)
UNARY_MODULES.update(activations.MODULES)
# more forms of identities (module.identities, which also removes them before fusion)
UNARY_FUNCTIONS.update(identities.FUNCTIONS)
UNARY_METHODS.update(identities.METHODS)
UNARY_MODULES.update(identities.MODULES)
BINARY_FUNCTIONS = {q(f): op for f, op in [
    (operator.add, "add"), (torch.add, "add"), (operator.sub, "sub"), (torch.sub, "sub"),
    (operator.mul, "mul"), (torch.mul, "mul"), (operator.truediv, "div"), (torch.div, "div"),
    (torch.maximum, "maximum"), (torch.minimum, "minimum"),
    (torch.multiply, "mul"), (torch.subtract, "sub"), (torch.divide, "div"), (torch.true_divide, "div"),
]}
BINARY_METHODS = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "truediv": "div",
                  "maximum": "maximum", "minimum": "minimum",
                  "multiply": "mul", "subtract": "sub", "divide": "div", "true_divide": "div"}
MATMUL_FUNCTIONS = {q(f) for f in (torch.matmul, operator.matmul, torch.mm, torch.bmm)}
ADDMM = q(torch.addmm)
PRELU = q(F.prelu)
LINEAR_FUNCTION = q(F.linear)
EINSUM = q(torch.einsum)
REDUCE_FUNCTIONS = {q(f): op for f, op in [
    (torch.sum, "sum"), (torch.mean, "mean"), (torch.amax, "max"), (torch.amin, "min"), (torch.max, "max"),
    (torch.min, "min"), (torch.argmax, "argmax"), (torch.argmin, "argmin"), (torch.prod, "prod"),
    (torch.logsumexp, "logsumexp")]}
REDUCE_METHODS = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "max": "max", "min": "min",
                  "argmax": "argmax", "argmin": "argmin", "prod": "prod", "logsumexp": "logsumexp"}
VARIANCE = {q(torch.var): "var", q(torch.std): "std"}
# vector norms as reductions with a prologue and an epilogue: (the order's argument, its default)
NORM_FUNCTIONS = {q(torch.norm): ("p", "fro"), q(torch.linalg.vector_norm): ("ord", 2),
                  q(torch.linalg.norm): ("ord", None)}
SOFTMAX_FUNCTIONS = {q(F.softmax): "softmax", q(torch.softmax): "softmax",
                     q(F.log_softmax): "log_softmax", q(torch.log_softmax): "log_softmax"}
SOFTMAX_MODULES = {_cls(nn.Softmax): "softmax", _cls(nn.LogSoftmax): "log_softmax"}
LAYERNORM, RMSNORM = q(F.layer_norm), q(F.rms_norm) if hasattr(F, "rms_norm") else None
NORM_MODULES = {_cls(nn.LayerNorm): "layernorm"}
if hasattr(nn, "RMSNorm"):
    NORM_MODULES[_cls(nn.RMSNorm)] = "rmsnorm"
TRANSPOSES = {q(torch.transpose), q(torch.t)}
RSQRT, SQRT = {q(torch.rsqrt)}, {q(torch.sqrt), q(math.sqrt)}


def einsum_b_layout(equation: str) -> str | None:
    """"kn" or "nk" when an einsum of two operands a, b is a matmul a @ b (or a @ b^T): a's last
    letter k is contracted with one of b's last two, b's other last letter n ends the output,
    and a's other letters lead it: 'bijl,lk->bijk', 'ij,kj->ik'; for a batched b ('bij,bjk->bik')
    its leading letters are a's own; 'ij,jk' (no output) means 'ij,jk->ik'.  None for any other equation."""
    terms = _einsum_terms(equation)
    if terms is None:
        return None
    ea, eb, out = terms
    if len(ea) < 2 or len(eb) < 2 or len(set(ea)) != len(ea) or len(set(eb)) != len(eb):
        return None
    k, batch = ea[-1], eb[:-2]
    layout = "kn" if eb[-2] == k else "nk" if eb[-1] == k else None
    n = eb[-1] if layout == "kn" else eb[-2]
    if layout is None or n in ea or out != ea[:-1] + n:
        return None
    if batch and (len(eb) != len(ea) or ea[:-2] != batch):
        return None
    return layout


def _einsum_terms(equation: str) -> tuple[str, str, str] | None:
    """(a's letters, b's letters, the output's) of a two-operand einsum without ellipsis; an
    implicit output is the letters seen once, sorted."""
    eq = equation.replace(" ", "")
    if "->" not in eq and eq.count(",") == 1:
        eq += "->" + "".join(sorted(ch for ch in set(eq) if ch.isalpha() and eq.count(ch) == 1))
    if "." in eq or eq.count("->") != 1 or eq.count(",") != 1:
        return None
    (ea, eb), out = eq.split("->")[0].split(","), eq.split("->")[1]
    return ea, eb, out


def _einsum_why(equation: str, operands: int) -> str:
    """Why an einsum is not served: several operands, or a contraction that is a (batched) matmul
    only after its operands' dims are permuted and merged (Mamba2's 'bhzc,bchpn->bzhpn'), or none."""
    terms = _einsum_terms(equation) if operands == 2 and isinstance(equation, str) else None
    if terms is None:
        return "not a matmul of two operands"
    ea, eb, out = terms
    contracted = (set(ea) & set(eb)) - set(out)
    if contracted and set(out) == (set(ea) | set(eb)) - contracted:
        return ("a batched matmul only after its operands' dims are permuted and merged (copies, as "
                "torch.einsum makes them); reading them through their strides is not done yet")
    return "not a matmul (a reduction or a diagonal besides the contraction)"


@dataclass
class Pointwise:
    """A node that is elementwise on its input(s).  unary: `steps` apply to `inputs[0]`
    (empty steps: a no-op such as contiguous or dropout(p=0)); binary: `binop` of inputs[0],
    inputs[1] (NodeRefs or numbers)."""
    inputs: list
    steps: list[dict] = field(default_factory=list)
    binop: str | None = None
    covers: list[str] = field(default_factory=list)  # more nodes it spans (the sigmoid of x * sigmoid(x))
    value: float | None = None      # a mask binop's fill value (module.where_fusion)
    operand_shape: list | None = None   # how inputs[1] broadcasts, when not as its own shape (PReLU's [C, 1, 1])


@dataclass
class Anchor:
    """A node a group is built around (matmul, reduction, softmax, norm)."""
    family: str
    op: str
    x: NodeRef                      # main input (matmul: a)
    params: dict = field(default_factory=dict)
    b: object = None                # matmul: NodeRef or {"attr": path}
    b_nk: bool = False
    bias: object = None             # linear bias (NodeRef or {"attr": path})
    vectors: list = field(default_factory=list)   # norm weight (and bias), as refs
    covers: list[str] = field(default_factory=list)  # more nodes the op spans
    out: str = ""                   # the node holding the op's result
    replaces: list[str] = field(default_factory=list)  # nodes whose uses get the result
    dim: int | None = None          # reductions: the reduced dim (None: all)
    keepdim: bool = False
    pre: list = field(default_factory=list)    # reductions: steps on x before it (a norm's square)
    post: list = field(default_factory=list)   # ... and on the result (a norm's sqrt)
    state: dict = field(default_factory=dict)   # norms: trailing dims, batch norm's running buffers


def _arg(args: tuple, kwargs: dict, i: int, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


class Reject(Exception):
    """A node the catalog could serve in kind, but not in this form; the message says why."""


class Classifier:
    """plugins: modules classifying more anchors (module.conv_fusion), each with
    classify_call(classifier, name, fn, args, kwargs) and classify_module(classifier, name,
    target, info, x), returning an Anchor or None (a Reject says why not)."""

    def __init__(self, g: Graph, plugins: tuple = ()):
        self.g = g
        self.plugins = plugins

    def __call__(self, name: str):
        """Pointwise, Anchor, or None; raises Reject with a reason for near misses."""
        n = self.g.by_name[name]
        if n["op"] not in ("call_function", "call_method", "call_module"):
            return None
        if self.g.tensor(name) is None and "seq" not in n["value"]:  # (values, indices) of max(x, dim)
            return None
        args, kwargs = self.g.args(name)
        if kwargs.get("out") is not None:
            raise Reject("out= arguments are not fused")
        if n["op"] == "call_module":
            return self._module(name, n["target"], args, kwargs)
        fn = n["target"] if n["op"] == "call_function" else None
        method = n["target"] if n["op"] == "call_method" else None
        inplace = bool(method and method.endswith("_") and method[:-1] in {**UNARY_METHODS, **BINARY_METHODS})
        if inplace:
            method = method[:-1]
        if inplace or kwargs.get("inplace") or fn in activations.INPLACE_FUNCTIONS:
            self._check_inplace(args[0], name)
        if fn in UNARY_FUNCTIONS or method in UNARY_METHODS:
            return self._unary(UNARY_FUNCTIONS.get(fn) or UNARY_METHODS[method], name, args, kwargs)
        if fn in BINARY_FUNCTIONS or method in BINARY_METHODS:
            if kwargs.get("alpha", 1) != 1 or kwargs.get("rounding_mode"):
                raise Reject("alpha or rounding_mode arguments are not fused")
            pair = [_arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "other")]
            if any(v is None for v in pair):
                return None
            pair = self._literals(pair)
            return Pointwise(pair, binop=BINARY_FUNCTIONS.get(fn) or BINARY_METHODS[method])
        if fn in MATMUL_FUNCTIONS or method in ("matmul", "mm", "bmm"):
            return self._matmul(name, args[0], _arg(args, kwargs, 1, "other", kwargs.get("mat2")))
        if fn == PRELU:
            return self._prelu(args[0], _arg(args, kwargs, 1, "weight"))
        if fn == ADDMM or method == "addmm":
            return self._addmm(name, args, kwargs)
        if fn == EINSUM:
            return self._einsum(name, args)
        if fn == LINEAR_FUNCTION:
            return self._linear(name, args[0], _arg(args, kwargs, 1, "weight"), _arg(args, kwargs, 2, "bias"))
        if fn in REDUCE_FUNCTIONS or method in REDUCE_METHODS:
            return self._reduce(name, REDUCE_FUNCTIONS.get(fn) or REDUCE_METHODS[method], args, kwargs)
        if fn in NORM_FUNCTIONS or method == "norm":
            return self._vector_norm(name, fn, args, kwargs)
        if fn in VARIANCE or method in ("var", "std"):
            return self._variance(name, VARIANCE.get(fn) or method, args, kwargs)
        if fn in SOFTMAX_FUNCTIONS or method in ("softmax", "log_softmax"):
            op = SOFTMAX_FUNCTIONS.get(fn) or method
            if _arg(args, kwargs, 3 if fn == q(F.softmax) or fn == q(F.log_softmax) else 2, "dtype") is not None:
                raise Reject(f"{op} with a dtype= cast is not fused")
            return self._softmax(name, op, args[0], _arg(args, kwargs, 1, "dim"))
        if fn == LAYERNORM:
            return self._norm(name, "layernorm", args[0], _arg(args, kwargs, 1, "normalized_shape"),
                              _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias"),
                              _arg(args, kwargs, 4, "eps", 1e-5))
        if RMSNORM and fn == RMSNORM:
            return self._norm(name, "rmsnorm", args[0], _arg(args, kwargs, 1, "normalized_shape"),
                              _arg(args, kwargs, 2, "weight"), None, _arg(args, kwargs, 3, "eps"))
        return next((a for p in self.plugins if (a := p.classify_call(self, name, fn, args, kwargs)) is not None),
                    None)

    # -- pointwise --
    def _check_inplace(self, x, name: str) -> None:
        """An in-place op (node `name`) fuses as its out-of-place twin only when nobody can see
        the difference: not the caller, not a later reader of the value or of any view sharing
        its storage."""
        if not isinstance(x, NodeRef):
            return
        root, family = storage_family(self.g, x.name)
        if self.g.by_name[root]["op"] in ("placeholder", "get_attr"):
            raise Reject("in-place op on an input or a parameter (the caller sees the change)")
        if len(self.g.users[x.name]) > 1:
            raise Reject("in-place op on a tensor that is used elsewhere")
        here, before = self.g.order[name], changed_elsewhere(self.g, name)
        if any(self.g.order[u] > here and u not in family for m in before for u in self.g.users[m]):
            raise Reject("in-place op on a view: the change reaches the tensor it views, which is read later")

    def _unary(self, op: str, name: str, args: tuple, kwargs: dict) -> Pointwise:
        x = args[0]
        if op in activations.PARAMS:
            try:
                return Pointwise([x], activations.call_steps(op, args, kwargs))
            except ValueError as e:
                raise Reject(str(e)) from None
        if op == "gelu":
            approx = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
            return Pointwise([x], [{"op": "gelu_tanh" if approx == "tanh" else "gelu"}])
        if op == "leaky_relu":
            return Pointwise([x], [{"op": "leaky_relu", "value": float(_arg(args, kwargs, 1, "negative_slope", 0.01))}])
        if op in ("clamp", "clamp_min", "clamp_max", "relu6", "hardtanh"):
            if op == "relu6":
                lo, hi = 0.0, 6.0
            elif op == "hardtanh":
                lo, hi = _arg(args, kwargs, 1, "min_val", -1.0), _arg(args, kwargs, 2, "max_val", 1.0)
            elif op == "clamp_min":
                lo, hi = _arg(args, kwargs, 1, "min"), None
            elif op == "clamp_max":
                lo, hi = None, _arg(args, kwargs, 1, "max")
            else:
                lo, hi = _arg(args, kwargs, 1, "min"), _arg(args, kwargs, 2, "max")
            if any(v is not None and not isinstance(v, (int, float)) for v in (lo, hi)):
                raise Reject("clamp bounds that are tensors are not fused")
            steps = ([{"op": "clamp_min", "value": float(lo)}] if lo is not None else []) + \
                    ([{"op": "clamp_max", "value": float(hi)}] if hi is not None else [])
            return Pointwise([x], steps)
        if op == "pow":
            if not isinstance(x, NodeRef):
                raise Reject("a number raised to a tensor power is not fused")
            try:
                return Pointwise([x], activations.pow_steps(_arg(args, kwargs, 1, "exponent")))
            except ValueError as e:
                raise Reject(str(e)) from None
        if op == "dropout":
            p, training = _arg(args, kwargs, 1, "p", 0.5), _arg(args, kwargs, 2, "training", True)
            if p and training:
                raise Reject("dropout in training mode is random; it stays PyTorch")
            return Pointwise([x])
        if op == "cast":
            shape_dtype = self.g.tensor(name)
            if not isinstance(x, NodeRef) or self.g.tensor(x) != shape_dtype:
                raise Reject("dtype casts are not fused")
            return Pointwise([x])
        if op == "identity":
            return Pointwise([x])
        return Pointwise([x], [{"op": op}])

    def _module(self, name: str, target: str, args: tuple, kwargs: dict):
        info = self.g.modules.get(target, {})
        kind, attrs, params = info.get("type", ""), info.get("attrs", {}), info.get("params", {})
        x = args[0] if args else None
        if attrs.get("inplace"):
            self._check_inplace(x, name)
        if kind == _cls(nn.Linear):
            bias = {"attr": f"{target}.bias"} if "bias" in params else None
            return self._linear(name, x, {"attr": f"{target}.weight"}, bias,
                                weight_shape=params["weight"]["shape"])
        if kind in SOFTMAX_MODULES:
            return self._softmax(name, SOFTMAX_MODULES[kind], x, attrs.get("dim"))
        if kind in NORM_MODULES:
            op = NORM_MODULES[kind]
            affine = attrs.get("elementwise_affine", True)
            weight = {"attr": f"{target}.weight"} if affine and "weight" in params else None
            bias = {"attr": f"{target}.bias"} if affine and "bias" in params else None
            return self._norm(name, op, x, attrs.get("normalized_shape"), weight, bias, attrs.get("eps"))
        if kind in UNARY_MODULES:
            op = UNARY_MODULES[kind]
            if op == "gelu":
                return Pointwise([x], [{"op": "gelu_tanh" if attrs.get("approximate") == "tanh" else "gelu"}])
            if op == "leaky_relu":
                return Pointwise([x], [{"op": "leaky_relu", "value": float(attrs.get("negative_slope", 0.01))}])
            if op == "relu6":
                return Pointwise([x], [{"op": "clamp_min", "value": 0.0}, {"op": "clamp_max", "value": 6.0}])
            if op == "hardtanh":
                return Pointwise([x], [{"op": "clamp_min", "value": float(attrs.get("min_val", -1.0))},
                                       {"op": "clamp_max", "value": float(attrs.get("max_val", 1.0))}])
            if op == "dropout":
                if attrs.get("p") and attrs.get("training", True):
                    raise Reject("dropout in training mode is random; it stays PyTorch")
                return Pointwise([x])
            if op == "identity":
                return Pointwise([x])
            if op in activations.PARAMS:
                try:
                    return Pointwise([x], activations.module_steps(op, attrs))
                except ValueError as e:
                    raise Reject(str(e)) from None
            return Pointwise([x], [{"op": op}])
        return next((a for p in self.plugins if (a := p.classify_module(self, name, target, info, x)) is not None),
                    None)

    # -- anchors --
    def _float_tensor(self, ref, what: str) -> tuple[list[int], str]:
        t = self.g.tensor(ref) if isinstance(ref, NodeRef) else None
        if t is None:
            raise Reject(f"{what} is not a tensor")
        if t[1] not in DTYPES:
            raise Reject(f"{what} is {t[1]}; kernels take {', '.join(DTYPES)}")
        return t

    def _transposed(self, ref) -> NodeRef | None:
        """X when `ref` is X with its last two dims swapped (X.transpose(-2, -1), X.t(), X.mT,
        X.permute(0, 1, 3, 2))."""
        if not isinstance(ref, NodeRef):
            return None
        n = self.g.by_name[ref.name]
        args, kwargs = self.g.args(ref.name)
        src = args[0] if args else None
        t = self.g.tensor(src) if isinstance(src, NodeRef) else None
        if t is None:
            return None
        nd = len(t[0])
        if (n["op"] == "call_method" and n["target"] == "transpose") or (
                n["op"] == "call_function" and n["target"] == q(torch.transpose)):
            dims = {d % nd for d in args[1:3]} if len(args) >= 3 and all(isinstance(d, int) for d in args[1:3]) else set()
            return src if nd >= 2 and dims == {nd - 2, nd - 1} else None
        if (n["op"] == "call_method" and n["target"] == "permute") or (
                n["op"] == "call_function" and n["target"] == q(torch.permute)):
            dims = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else list(args[1:])
            swap = list(range(nd - 2)) + [nd - 1, nd - 2]
            return src if nd >= 2 and [d % nd if isinstance(d, int) else d for d in dims] == swap else None
        if (n["op"] == "call_method" and n["target"] == "t") or (n["op"] == "call_function" and n["target"] == q(torch.t)):
            return src if nd == 2 else None
        if n["op"] == "call_function" and n["target"] == "getattr" and len(args) == 2 and args[1] in ("T", "mT"):
            return src if nd == 2 or args[1] == "mT" else None
        return None

    def _matmul(self, name: str, a, b, b_nk: bool = False) -> Anchor:
        """a @ b; b_nk: b is stored as [N, K] (else a transpose feeding b is read through)."""
        (sa, da), (sb, db) = self._float_tensor(a, "the left operand"), self._float_tensor(b, "the right operand")
        if da != db:
            raise Reject(f"mixed dtypes {da} and {db}")
        if len(sa) < 2 or len(sb) < 2:
            raise Reject("matrix-vector products are not fused")
        src = None if b_nk else self._transposed(b)
        covers = [b.name] if src is not None and self.g.users[b.name] == [name] else []
        b_nk = b_nk or src is not None
        if len(sb) == 2:
            anchor = Anchor("matmul", "matmul", a, b=src or b, b_nk=b_nk, covers=covers)
        elif len(sa) == len(sb) and sa[:-2] == sb[:-2]:
            anchor = Anchor("matmul", "bmm", a, b=src or b, b_nk=b_nk, covers=covers)
        else:
            raise Reject("broadcast batch dims in a matmul are not fused")
        return anchor

    def _prelu(self, x, w) -> Pointwise:
        """F.prelu(x, w): w has one value or one per channel (dim 1 of x), read in place."""
        sx, dx = self._float_tensor(x, "the input")
        sw, dw = self._float_tensor(w, "the weight")
        n = math.prod(sw)
        if dw != dx:
            raise Reject(f"prelu weight of dtype {dw} on a {dx} input is not fused")
        if n == 1:
            return Pointwise([x, w], binop="prelu", operand_shape=[1])
        channels = sx[1] if len(sx) >= 2 else sx[0]
        if n != channels:
            raise Reject(f"prelu with {n} weights on {channels} channels")
        return Pointwise([x, w], binop="prelu", operand_shape=[n] + [1] * max(len(sx) - 2, 0))

    def _addmm(self, name: str, args: tuple, kwargs: dict) -> Anchor:
        """torch.addmm(v, a, b) = v + a @ b (GPT-2's Conv1D layer) with v a vector over the columns:
        the matmul with v as its bias."""
        v, a, b = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "mat1"), _arg(args, kwargs, 2, "mat2")
        if kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
            raise Reject("addmm with beta or alpha other than 1 is not fused")
        anchor = self._matmul(name, a, b)
        shape, _ = self._float_tensor(v, "the added input")
        if anchor.op != "matmul" or shape != self.g.tensor(b)[0][-1:]:
            raise Reject(f"addmm adding a {shape} tensor is not fused (a vector over the columns is)")
        anchor.bias = v
        return anchor

    def _einsum(self, name: str, args: tuple) -> Anchor:
        """An einsum that is a matmul (see einsum_b_layout), as that matmul."""
        equation, operands = args[0], list(args[1:])
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):  # einsum(eq, [a, b])
            operands = list(operands[0])
        layout = einsum_b_layout(equation) if isinstance(equation, str) and len(operands) == 2 else None
        if layout is None:
            raise Reject(f"einsum {equation!r}: " + _einsum_why(equation, len(operands)))
        return self._matmul(name, operands[0], operands[1], b_nk=layout == "nk")

    def _linear(self, name: str, x, weight, bias, weight_shape=None) -> Anchor:
        sx, dx = self._float_tensor(x, "the input")
        if isinstance(weight, NodeRef):
            weight_shape, dw = self._float_tensor(weight, "the weight")
            if dw != dx:
                raise Reject(f"mixed dtypes {dx} and {dw}")
        if weight_shape is None or len(weight_shape) != 2:
            raise Reject("the weight is not a matrix")
        if len(sx) < 1:
            raise Reject("linear of a scalar")
        return Anchor("matmul", "matmul", x, b=weight, b_nk=True, bias=bias)

    def _literals(self, pair: list) -> list:
        """A binop's operands with a 0-d constant beside a tensor read as its number (Graph.literal)."""
        values = [self.g.literal(v) for v in pair]
        return values if sum(isinstance(v, NodeRef) for v in values) == 1 else pair

    def _reduce(self, name: str, op: str, args: tuple, kwargs: dict) -> Anchor:
        x = args[0]
        if op in ("max", "min") and len(args) > 1 and isinstance(args[1], NodeRef):
            if self.g.tensor(args[1]) is not None:  # torch.max(a, b): elementwise
                return Pointwise(self._literals([x, args[1]]), binop="maximum" if op == "max" else "minimum")
        shape, _ = self._float_tensor(x, "the input")
        if kwargs.get("dtype") is not None:
            raise Reject(f"{op} with a dtype= cast is not fused")
        dim = _arg(args, kwargs, 1, "dim")
        keepdim = bool(_arg(args, kwargs, 2, "keepdim", False))
        if not shape or math.prod(shape) == 0:
            raise Reject(f"{op} of an empty or 0-d tensor")
        try:   # an int, a run of neighbouring dims [lo, ..., hi], or None (every dim)
            dim = activations.reduced_dims(op, dim, len(shape))
        except ValueError as e:
            raise Reject(str(e)) from None
        anchor = Anchor("reduction", op, x, dim=dim, keepdim=keepdim, out=name, replaces=[name])
        value = self.g.by_name[name]["value"]
        if "seq" in value:  # max/min with a dim: (values, indices)
            users = self.g.users[name]
            values, indices, unused = [], [], []
            for u in users:
                if not self.g.users[u]:  # `values, _ = torch.max(x, dim)`: a getter nobody reads
                    unused.append(u)
                    continue
                uargs, _ = self.g.args(u)
                n = self.g.by_name[u]
                which = uargs[1] if n["op"] == "call_function" and n["target"] in (q(operator.getitem), "getattr") else None
                (values if which in (0, "values") else indices if which in (1, "indices") else [None]).append(u)
            if None in values or None in indices or (values and indices) or not (values or indices):
                raise Reject(f"{op} whose values and indices are both used")
            if indices:
                anchor.op = "argmax" if op == "max" else "argmin"
            anchor.covers, anchor.replaces = values + indices + unused, values + indices
            anchor.out = (values + indices)[-1]
        return anchor

    def _vector_norm(self, name: str, fn: str | None, args: tuple, kwargs: dict) -> Anchor:
        """torch.norm / Tensor.norm / torch.linalg.(vector_)norm of order 1, 2 ("fro") or inf over
        dims: a reduction with steps before and after it (2: square, sum, sqrt)."""
        order_arg, default = NORM_FUNCTIONS.get(fn, ("p", "fro"))
        order = _arg(args, kwargs, 1, order_arg, default)
        dim = _arg(args, kwargs, 2, "dim")
        if kwargs.get("dtype") is not None or kwargs.get("out") is not None:
            raise Reject("a norm with dtype= or out= is not fused")
        if fn == q(torch.linalg.norm) and not (isinstance(dim, int) or (dim is None and order is None)):
            raise Reject("torch.linalg.norm over several dims is a matrix norm: not fused")
        if order in (None, "fro"):
            order = 2
        if isinstance(order, str) or isinstance(order, bool) or not isinstance(order, (int, float)):
            raise Reject(f"a norm of order {order!r} is not fused")
        forms = {1: ([{"op": "abs"}], "sum", []), 2: ([{"op": "square"}], "sum", [{"op": "sqrt"}]),
                 math.inf: ([{"op": "abs"}], "max", []), -math.inf: ([{"op": "abs"}], "min", [])}
        if order not in forms:
            raise Reject(f"a norm of order {order} is not fused (orders 1, 2 and inf are)")
        pre, op, post = forms[order]
        anchor = self._reduce(name, op, (args[0], dim, _arg(args, kwargs, 3, "keepdim", False)), {})
        anchor.pre, anchor.post = list(pre), list(post)
        return anchor

    def _variance(self, name: str, op: str, args: tuple, kwargs: dict) -> Anchor:
        """torch.var / torch.std (and the methods) over dims, with torch's correction (or the old
        `unbiased` flag, by keyword or position): a var reduction, std with a sqrt after it."""
        rest = list(args[1:])
        unbiased = kwargs.get("unbiased")
        if rest and isinstance(rest[0], bool):   # var(x, unbiased)
            unbiased, rest = rest.pop(0), rest
        dim = rest[0] if rest else kwargs.get("dim")
        if len(rest) > 1 and isinstance(rest[1], bool):   # var(x, dim, unbiased, keepdim)
            unbiased = rest[1]
            rest = [rest[0], *rest[2:]]
        keepdim = rest[1] if len(rest) > 1 else kwargs.get("keepdim", False)
        correction = kwargs.get("correction", 1 if unbiased in (None, True) else 0)
        if isinstance(correction, bool) or not isinstance(correction, int) or correction < 0:
            raise Reject(f"{op} with correction={correction!r} is not fused")
        anchor = self._reduce(name, "var", (args[0], dim, keepdim), {})
        anchor.params = {"correction": correction}
        anchor.post = [{"op": "sqrt"}] if op == "std" else []
        return anchor

    def _softmax(self, name: str, op: str, x, dim) -> Anchor:
        shape, _ = self._float_tensor(x, "the input")
        if dim is None or isinstance(dim, bool) or not isinstance(dim, int) or not -len(shape) <= dim < len(shape):
            raise Reject(f"{op} over dim {dim!r}: kernels take one dim given as an integer")
        # a middle dim is read in place as [outer, dim, inner] (the strided row layout)
        return Anchor("softmax", op, x, out=name, replaces=[name], dim=dim % len(shape))

    def _norm(self, name: str, op: str, x, normalized_shape, weight, bias, eps) -> Anchor:
        shape, dtype = self._float_tensor(x, "the input")
        ns = list(normalized_shape) if isinstance(normalized_shape, (list, tuple)) else [normalized_shape]
        ns = [self.g.number(v) if isinstance(v, NodeRef) else v for v in ns]  # (x.shape[-1],)
        if not ns or len(ns) > len(shape) or ns != shape[len(shape) - len(ns):]:
            raise Reject(f"{op} with normalized_shape {ns} that is not the input's last dims ({shape})")
        if op == "layernorm" and weight is None and bias is not None:
            raise Reject("layer_norm with a bias but no weight is not in the catalog")
        if eps is None:
            eps = torch.finfo(getattr(torch, dtype)).eps
        if not isinstance(eps, (int, float)):
            raise Reject("eps is not a number")
        vectors = [v for v in (weight, bias) if v is not None]
        params = {"eps": float(eps), "affine": bool(vectors)}
        if op == "layernorm" and weight is not None and bias is None:
            params["bias"] = False
        return Anchor("norm", op, x, params=params, vectors=vectors, out=name, replaces=[name],
                      state={"trailing": len(ns)})
