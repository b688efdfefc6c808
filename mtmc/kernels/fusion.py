"""Split a captured forward graph into fusion groups the op catalog can serve.

Input: one graph of kernels.capture's result (plain JSON).  Output: groups, each a KernelSpec at
the shapes seen at run time plus a *binding* saying where every kernel input comes from (a
graph value or a parameter, and the reshape-only view that turns it into the kernel's [M, N] /
[B, M, K] layout) and how the kernel's output is viewed back into the node's shape.

Groups, found in graph order:
  * matmul / linear / bmm, with the pointwise epilogue that follows (bias, activation, scale,
    residual);
  * reductions, softmax and norms (LayerNorm, RMSNorm, a hand-written RMSNorm) with the
    pointwise prologue that feeds them and, for softmax and norms, the epilogue after them;
  * chains of the remaining pointwise ops.
A node joins a group only when all its users are in the group (the kernel returns one value),
so the fused group computes exactly what the nodes did.  Everything else (convolutions,
concatenations, views, ops outside the catalog) stays a PyTorch call; `torch_ops` says which and
why.  Broadcast operands a kernel cannot index (a [C, 1, 1] bias on NCHW, a mask broadcast over
heads) are expanded to full size first, which costs memory traffic; the group's notes say so.
"""
from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtmc.kernels import pointwise
from mtmc.kernels.catalog import family_of
from mtmc.kernels.fxjson import arg_nodes, decode_arg, target_name
from mtmc.kernels.spec import DTYPES, KernelSpec


# -- reading the captured graph ---------------------------------------------------------------

@dataclass(frozen=True)
class NodeRef:
    """An argument that is another node's value."""
    name: str


class _Refs(dict):
    def __missing__(self, name):
        return NodeRef(name)


class Graph:
    """Read-only view of one captured graph: nodes in order, users, values, modules."""

    def __init__(self, desc: dict):
        self.path = desc.get("path", "")
        self.nodes = desc["nodes"]
        self.by_name = {n["name"]: n for n in self.nodes}
        self.order = {n["name"]: i for i, n in enumerate(self.nodes)}
        self.modules = desc.get("modules", {})
        self.line_of = desc.get("line_of", {})
        self.users: dict[str, list[str]] = {n["name"]: [] for n in self.nodes}
        for n in self.nodes:
            for used in dict.fromkeys(arg_nodes(n["args"]) + arg_nodes(n["kwargs"])):
                self.users[used].append(n["name"])

    def args(self, name: str) -> tuple[tuple, dict]:
        n = self.by_name[name]
        return tuple(decode_arg(n["args"], _Refs())), decode_arg(n["kwargs"], _Refs())

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
            what = what.removeprefix("_operator.").removeprefix("torch.")
        line = self.line_of.get(name)
        return f"{what} (line {line})" if line else what


# -- what each node computes ----------------------------------------------------------------

def _q(fn) -> str:
    return target_name(fn)


def _cls(c) -> str:
    return f"{c.__module__}.{c.__qualname__}"


UNARY_FUNCTIONS = {_q(f): op for f, op in [
    (torch.relu, "relu"), (F.relu, "relu"), (torch.sigmoid, "sigmoid"), (F.sigmoid, "sigmoid"),
    (torch.tanh, "tanh"), (F.tanh, "tanh"), (torch.exp, "exp"), (torch.abs, "abs"), (torch.neg, "neg"),
    (operator.neg, "neg"), (torch.square, "square"), (F.silu, "silu"), (F.gelu, "gelu"),
    (F.leaky_relu, "leaky_relu"), (torch.clamp, "clamp"), (torch.clip, "clamp"), (F.relu6, "relu6"),
    (F.hardtanh, "hardtanh"), (F.dropout, "dropout"), (torch.pow, "pow"), (operator.pow, "pow"),
    (operator.abs, "abs"), (torch.clamp_min, "clamp_min"), (torch.clamp_max, "clamp_max"),
]}
UNARY_METHODS = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "abs": "abs",
                 "neg": "neg", "square": "square", "clamp": "clamp", "clip": "clamp", "pow": "pow",
                 "clamp_min": "clamp_min", "clamp_max": "clamp_max", "contiguous": "identity",
                 "clone": "identity", "float": "cast", "half": "cast", "bfloat16": "cast", "to": "cast",
                 "type_as": "cast"}
UNARY_MODULES = {_cls(c): op for c, op in [
    (nn.ReLU, "relu"), (nn.GELU, "gelu"), (nn.SiLU, "silu"), (nn.Sigmoid, "sigmoid"), (nn.Tanh, "tanh"),
    (nn.LeakyReLU, "leaky_relu"), (nn.ReLU6, "relu6"), (nn.Hardtanh, "hardtanh"), (nn.Identity, "identity"),
    (nn.Dropout, "dropout"),
]}
BINARY_FUNCTIONS = {_q(f): op for f, op in [
    (operator.add, "add"), (torch.add, "add"), (operator.sub, "sub"), (torch.sub, "sub"),
    (operator.mul, "mul"), (torch.mul, "mul"), (operator.truediv, "div"), (torch.div, "div"),
    (torch.maximum, "maximum"), (torch.minimum, "minimum"),
]}
BINARY_METHODS = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "truediv": "div",
                  "maximum": "maximum", "minimum": "minimum"}
MATMUL_FUNCTIONS = {_q(f) for f in (torch.matmul, operator.matmul, torch.mm, torch.bmm)}
LINEAR_FUNCTION = _q(F.linear)
REDUCE_FUNCTIONS = {_q(f): op for f, op in [
    (torch.sum, "sum"), (torch.mean, "mean"), (torch.amax, "max"), (torch.amin, "min"), (torch.max, "max"),
    (torch.min, "min"), (torch.argmax, "argmax"), (torch.argmin, "argmin")]}
REDUCE_METHODS = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "max": "max", "min": "min",
                  "argmax": "argmax", "argmin": "argmin"}
SOFTMAX_FUNCTIONS = {_q(F.softmax): "softmax", _q(torch.softmax): "softmax",
                     _q(F.log_softmax): "log_softmax", _q(torch.log_softmax): "log_softmax"}
SOFTMAX_MODULES = {_cls(nn.Softmax): "softmax", _cls(nn.LogSoftmax): "log_softmax"}
LAYERNORM, RMSNORM = _q(F.layer_norm), _q(F.rms_norm) if hasattr(F, "rms_norm") else None
NORM_MODULES = {_cls(nn.LayerNorm): "layernorm"}
if hasattr(nn, "RMSNorm"):
    NORM_MODULES[_cls(nn.RMSNorm)] = "rmsnorm"
TRANSPOSES = {_q(torch.transpose), _q(torch.t)}
RSQRT, SQRT = {_q(torch.rsqrt)}, {_q(torch.sqrt), _q(math.sqrt)}
MEAN = {_q(torch.mean)}


@dataclass
class Pointwise:
    """A node that is elementwise on its input(s).  unary: `steps` apply to `inputs[0]`
    (empty steps: a no-op such as contiguous or dropout(p=0)); binary: `binop` of inputs[0],
    inputs[1] (NodeRefs or numbers)."""
    inputs: list
    steps: list[dict] = field(default_factory=list)
    binop: str | None = None


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


def _arg(args: tuple, kwargs: dict, i: int, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


class Reject(Exception):
    """A node the catalog could serve in kind, but not in this form; the message says why."""


class Classifier:
    def __init__(self, g: Graph):
        self.g = g

    def __call__(self, name: str):
        """Pointwise, Anchor, or None; raises Reject with a reason for near misses."""
        n = self.g.by_name[name]
        if n["op"] not in ("call_function", "call_method", "call_module"):
            return None
        if self.g.tensor(name) is None and "seq" not in n["value"]:  # (values, indices) of max(x, dim)
            return None
        args, kwargs = self.g.args(name)
        if n["op"] == "call_module":
            return self._module(name, n["target"], args, kwargs)
        fn = n["target"] if n["op"] == "call_function" else None
        method = n["target"] if n["op"] == "call_method" else None
        inplace = bool(method and method.endswith("_") and method[:-1] in {**UNARY_METHODS, **BINARY_METHODS})
        if inplace:
            method = method[:-1]
        if inplace or kwargs.get("inplace"):
            self._check_inplace(args[0])
        if fn in UNARY_FUNCTIONS or method in UNARY_METHODS:
            return self._unary(UNARY_FUNCTIONS.get(fn) or UNARY_METHODS[method], name, args, kwargs)
        if fn in BINARY_FUNCTIONS or method in BINARY_METHODS:
            if kwargs.get("alpha", 1) != 1 or kwargs.get("rounding_mode") or kwargs.get("out") is not None:
                raise Reject("alpha, rounding_mode or out= arguments are not fused")
            return Pointwise(list(args[:2]), binop=BINARY_FUNCTIONS.get(fn) or BINARY_METHODS[method])
        if fn in MATMUL_FUNCTIONS or method in ("matmul", "mm", "bmm"):
            return self._matmul(name, args[0], args[1])
        if fn == LINEAR_FUNCTION:
            return self._linear(name, args[0], _arg(args, kwargs, 1, "weight"), _arg(args, kwargs, 2, "bias"))
        if fn in REDUCE_FUNCTIONS or method in REDUCE_METHODS:
            return self._reduce(name, REDUCE_FUNCTIONS.get(fn) or REDUCE_METHODS[method], args, kwargs)
        if fn in SOFTMAX_FUNCTIONS or method in ("softmax", "log_softmax"):
            op = SOFTMAX_FUNCTIONS.get(fn) or method
            if _arg(args, kwargs, 3 if fn == _q(F.softmax) or fn == _q(F.log_softmax) else 2, "dtype") is not None:
                raise Reject(f"{op} with a dtype= cast is not fused")
            return self._softmax(name, op, args[0], _arg(args, kwargs, 1, "dim"))
        if fn == LAYERNORM:
            return self._norm(name, "layernorm", args[0], _arg(args, kwargs, 1, "normalized_shape"),
                              _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias"),
                              _arg(args, kwargs, 4, "eps", 1e-5))
        if RMSNORM and fn == RMSNORM:
            return self._norm(name, "rmsnorm", args[0], _arg(args, kwargs, 1, "normalized_shape"),
                              _arg(args, kwargs, 2, "weight"), None, _arg(args, kwargs, 3, "eps"))
        return None

    # -- pointwise --
    def _check_inplace(self, x) -> None:
        if isinstance(x, NodeRef) and len(self.g.users[x.name]) > 1:
            raise Reject("in-place op on a tensor that is used elsewhere")

    def _unary(self, op: str, name: str, args: tuple, kwargs: dict) -> Pointwise:
        x = args[0]
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
            if self.g.number(args[1]) != 2.0 or not isinstance(args[1], (int, float)):
                raise Reject("only the power 2 is fused")
            return Pointwise([x], [{"op": "square"}])
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
            self._check_inplace(x)
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
            if op == "layernorm" and affine and (weight is None) != (bias is None):
                raise Reject("LayerNorm with a weight but no bias is not in the catalog")
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
            return Pointwise([x], [{"op": op}])
        return None

    # -- anchors --
    def _float_tensor(self, ref, what: str) -> tuple[list[int], str]:
        t = self.g.tensor(ref) if isinstance(ref, NodeRef) else None
        if t is None:
            raise Reject(f"{what} is not a tensor")
        if t[1] not in DTYPES:
            raise Reject(f"{what} is {t[1]}; kernels take {', '.join(DTYPES)}")
        return t

    def _transposed(self, ref) -> NodeRef | None:
        """X when `ref` is X with its last two dims swapped (X.transpose(-2, -1), X.t(), X.mT)."""
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
                n["op"] == "call_function" and n["target"] == _q(torch.transpose)):
            dims = {d % nd for d in args[1:3]} if len(args) >= 3 and all(isinstance(d, int) for d in args[1:3]) else set()
            return src if nd >= 2 and dims == {nd - 2, nd - 1} else None
        if (n["op"] == "call_method" and n["target"] == "t") or (n["op"] == "call_function" and n["target"] == _q(torch.t)):
            return src if nd == 2 else None
        if n["op"] == "call_function" and n["target"] == "getattr" and len(args) == 2 and args[1] in ("T", "mT"):
            return src if nd == 2 or args[1] == "mT" else None
        return None

    def _matmul(self, name: str, a, b) -> Anchor:
        (sa, da), (sb, db) = self._float_tensor(a, "the left operand"), self._float_tensor(b, "the right operand")
        if da != db:
            raise Reject(f"mixed dtypes {da} and {db}")
        if len(sa) < 2 or len(sb) < 2:
            raise Reject("matrix-vector products are not fused")
        src = self._transposed(b)
        covers = [b.name] if src is not None and self.g.users[b.name] == [name] else []
        if len(sb) == 2:
            anchor = Anchor("matmul", "matmul", a, b=src or b, b_nk=src is not None, covers=covers)
        elif len(sa) == len(sb) and sa[:-2] == sb[:-2]:
            anchor = Anchor("matmul", "bmm", a, b=src or b, b_nk=src is not None, covers=covers)
        else:
            raise Reject("broadcast batch dims in a matmul are not fused")
        return anchor

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

    def _reduce(self, name: str, op: str, args: tuple, kwargs: dict) -> Anchor:
        x = args[0]
        if op in ("max", "min") and len(args) > 1 and isinstance(args[1], NodeRef):
            if self.g.tensor(args[1]) is not None:  # torch.max(a, b): elementwise
                return Pointwise([x, args[1]], binop="maximum" if op == "max" else "minimum")
        shape, _ = self._float_tensor(x, "the input")
        if kwargs.get("dtype") is not None:
            raise Reject(f"{op} with a dtype= cast is not fused")
        dim = _arg(args, kwargs, 1, "dim")
        keepdim = bool(_arg(args, kwargs, 2, "keepdim", False))
        if isinstance(dim, (tuple, list)):
            if len(dim) != 1:
                raise Reject(f"{op} over several dims is not fused")
            dim = dim[0]
        if dim is not None and not isinstance(dim, int):
            raise Reject(f"{op} over a computed dim is not fused")
        if not shape or math.prod(shape) == 0:
            raise Reject(f"{op} of an empty or 0-d tensor")
        anchor = Anchor("reduction", op, x, dim=None if dim is None else dim % len(shape), keepdim=keepdim,
                        out=name, replaces=[name])
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
                which = uargs[1] if n["op"] == "call_function" and n["target"] in (_q(operator.getitem), "getattr") else None
                (values if which in (0, "values") else indices if which in (1, "indices") else [None]).append(u)
            if None in values or None in indices or (values and indices) or not (values or indices):
                raise Reject(f"{op} whose values and indices are both used")
            if indices:
                anchor.op = "argmax" if op == "max" else "argmin"
            anchor.covers, anchor.replaces = values + indices + unused, values + indices
            anchor.out = (values + indices)[-1]
        return anchor

    def _softmax(self, name: str, op: str, x, dim) -> Anchor:
        shape, _ = self._float_tensor(x, "the input")
        if dim is None or not isinstance(dim, int) or dim % len(shape) != len(shape) - 1:
            raise Reject(f"{op} over dim {dim}, not the last dim")
        return Anchor("softmax", op, x, out=name, replaces=[name])

    def _norm(self, name: str, op: str, x, normalized_shape, weight, bias, eps) -> Anchor:
        shape, dtype = self._float_tensor(x, "the input")
        ns = list(normalized_shape) if isinstance(normalized_shape, (list, tuple)) else [normalized_shape]
        if len(ns) != 1 or ns[0] != shape[-1]:
            raise Reject(f"{op} over the last {len(ns)} dims; kernels normalize the last dim only")
        if op == "layernorm" and (weight is None) != (bias is None):
            raise Reject("layer_norm with a weight but no bias is not in the catalog")
        if eps is None:
            eps = torch.finfo(getattr(torch, dtype)).eps
        if not isinstance(eps, (int, float)):
            raise Reject("eps is not a number")
        vectors = [v for v in (weight, bias) if v is not None]
        return Anchor("norm", op, x, params={"eps": float(eps), "affine": bool(vectors)}, vectors=vectors,
                      out=name, replaces=[name])


# -- groups -----------------------------------------------------------------------------------

@dataclass
class Group:
    """One kernel's worth of the graph, with everything needed to call it in place.

    args:   the values the wrapper takes, in order: {"node": name} or {"attr": param path}.
    inputs: one per kernel input, in the family's order: {"arg": i, "view": kind, ...}.
            views: "rows" ([-1, last dim]; "dim": moved last first), "flat" ([1, -1]),
            "vector" ([-1]), "batched" ([-1, M, K]), "as_is", "like" (expanded to the shape
            of "of": "main" or "out", then viewed like it).
    out:    how the output is made and viewed back: {"kind": "same" | "reduced" | "matmul" |
            "bmm", ...}.
    guards: scalar args the kernel was specialized for: {"arg": i, "value": v}.
    """
    id: int
    graph: str                       # the captured graph's module path ("" = Model itself)
    family: str
    nodes: list[str]
    replaces: list[str]
    ops: list[str]
    spec: dict
    args: list[dict]
    inputs: list[dict]
    out: dict
    guards: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Group":
        return cls(**d)


class _Builder:
    """Collects one group's nodes, kernel inputs, wrapper args, guards and notes."""

    def __init__(self, g: Graph, main: NodeRef, dtype: str):
        self.g, self.dtype = g, dtype
        self.nodes: list[str] = []
        self.inputs: list[dict] = []
        self.args: list[dict] = []
        self.guards: list[dict] = []
        self.notes: list[str] = []
        self.arg(main)  # the main input is always the wrapper's first argument

    def arg(self, ref) -> int:
        d = {"node": ref.name} if isinstance(ref, NodeRef) else dict(ref)
        if d not in self.args:
            self.args.append(d)
        return self.args.index(d)

    def guard(self, ref, value: float) -> None:
        """A scalar computed by the graph (from a size, say) is baked into the kernel; the
        wrapper checks it is still that value."""
        if isinstance(ref, NodeRef):
            g = {"arg": self.arg(ref), "value": value}
            if g not in self.guards:
                self.guards.append(g)


_BINOP_STEP = {"add": "add", "sub": "sub", "mul": "mul", "maximum": "maximum", "minimum": "minimum"}


class Partitioner:
    def __init__(self, desc: dict, first_id: int = 0):
        self.g = Graph(desc)
        classify = Classifier(self.g)
        self.sem: dict[str, object] = {}
        self.why: dict[str, str] = {}
        for n in self.g.nodes:
            try:
                s = classify(n["name"])
            except Reject as e:
                s, self.why[n["name"]] = None, str(e)
            if s is not None:
                self.sem[n["name"]] = s
        self.taken: set[str] = set()
        self.groups: list[Group] = []
        self.next_id = first_id

    def _ref_tensor(self, ref) -> tuple[list[int], str] | None:
        if isinstance(ref, NodeRef):
            return self.g.tensor(ref)
        module, _, name = ref["attr"].rpartition(".")
        p = self.g.modules.get(module, {}).get("params", {}).get(name)
        return (list(p["shape"]), p["dtype"]) if p else None

    def _single_user(self, name: str) -> str | None:
        users = self.g.users[name]
        return users[0] if len(users) == 1 else None

    # -- pointwise chains --
    def _step(self, node: str, running: str, b: _Builder, full_shape: list[int], operand_view: dict,
              vector_ok: bool) -> list[dict] | None:
        """Steps applying pointwise `node` to the running value; any other tensor it reads
        becomes a kernel input.  None (and `b` untouched) when `node` cannot continue the chain."""
        s = self.sem.get(node)
        if not isinstance(s, Pointwise) or node in self.taken or node in b.nodes:
            return None
        if self.g.tensor(node) != (full_shape, b.dtype):
            return None
        if s.binop is None:
            return list(s.steps) if s.inputs and s.inputs[0] == NodeRef(running) else None
        x, y = s.inputs
        first = x == NodeRef(running)
        if not first and y != NodeRef(running):
            return None
        other = y if first else x
        if other == NodeRef(running):   # x * x, x + x
            return {"mul": [{"op": "square"}], "add": [{"op": "scale", "value": 2.0}]}.get(s.binop)
        t = self.g.tensor(other) if isinstance(other, NodeRef) else None
        if t is None:
            return self._scalar_step(s.binop, other, first, b)
        if other.name in b.nodes or t[1] != b.dtype or s.binop == "div":
            return None
        oshape = t[0]
        if oshape != full_shape:
            try:
                if list(torch.broadcast_shapes(tuple(oshape), tuple(full_shape))) != full_shape:
                    return None
            except RuntimeError:
                return None
        is_vector = oshape and oshape[-1] == full_shape[-1] and math.prod(oshape) == oshape[-1]
        if vector_ok and is_vector and s.binop == "add" and oshape != full_shape:
            b.inputs.append({"arg": b.arg(other), "view": "vector"})
            return [{"op": "bias"}]
        if oshape != full_shape:
            b.notes.append(f"{self.g.words(other.name)} of shape {oshape} is expanded to {full_shape} "
                           "for the kernel (a copy)")
        b.inputs.append({"arg": b.arg(other), **operand_view})
        if s.binop == "sub" and not first:
            return [{"op": "neg"}, {"op": "add"}]
        return [{"op": _BINOP_STEP[s.binop]}]

    def _scalar_step(self, binop: str, other, first: bool, b: _Builder) -> list[dict] | None:
        num = self.g.number(other)
        if num is None or not math.isfinite(num):
            return None
        if binop == "add":
            steps = [{"op": "shift", "value": num}]
        elif binop == "sub":
            steps = [{"op": "shift", "value": -num}] if first else [{"op": "neg"}, {"op": "shift", "value": num}]
        elif binop == "mul":
            steps = [{"op": "scale", "value": num}]
        elif binop == "div" and first and num != 0:
            steps = [{"op": "scale", "value": 1.0 / num}]
        else:
            return None
        b.guard(other, num)
        return steps

    def _extend(self, start: str, b: _Builder, full_shape: list[int], operand_view: dict,
                vector_ok: bool) -> tuple[list[dict], str]:
        """Pointwise steps after `start` while each value has one user that continues the chain."""
        chain, last = [], start
        while (user := self._single_user(last)) is not None:
            steps = self._step(user, last, b, full_shape, operand_view, vector_ok)
            if steps is None:
                break
            chain += steps
            b.nodes.append(user)
            last = user
        return chain, last

    def _walk_back(self, x: NodeRef, shape: list[int], dtype: str, operand_view: dict,
                   vector_ok: bool) -> list[tuple[str, str]]:
        """The pointwise nodes feeding x, each used only by the next, as (node, its running
        input) in graph order."""
        links, cur = [], x.name
        scratch = _Builder(self.g, x, dtype)  # only asks whether each step would be accepted
        while True:
            s = self.sem.get(cur)
            if not isinstance(s, Pointwise) or cur in self.taken or len(self.g.users[cur]) != 1:
                break
            cands = [r for r in s.inputs if isinstance(r, NodeRef)]
            cands.sort(key=lambda r: not isinstance(self.sem.get(r.name), Pointwise))  # prefer longer chains
            chosen = next((r for r in cands
                           if self._step(cur, r.name, scratch, shape, operand_view, vector_ok) is not None), None)
            if chosen is None:
                break
            links.append((cur, chosen.name))
            cur = chosen.name
        return links[::-1]

    # -- group kinds --
    def _finish(self, family: str, op: str, dims: dict, params: dict, b: _Builder, out: dict,
                replaces: list[str]) -> None:
        spec = KernelSpec(family, op, dims, b.dtype, params)
        fam = family_of(spec)
        try:
            fam.validate(spec)
        except ValueError as e:
            for n in b.nodes:
                self.why.setdefault(n, str(e))
            return
        assert len(fam.inputs(spec)) == len(b.inputs), "binding does not match the family's inputs"
        order = sorted(b.nodes, key=self.g.order.get)
        ops = [self.g.words(n) for n in order if n not in self.free_nodes(order)]
        spec.request = f"module group: {' -> '.join(ops)}"
        self.groups.append(Group(self.next_id, self.g.path, family, order, replaces, ops, spec.to_dict(),
                                 b.args, b.inputs, out, b.guards, b.notes))
        self.next_id += 1
        self.taken.update(order)

    def free_nodes(self, names: list[str]) -> set[str]:
        """Nodes that only select or view (getitem of a tuple, transposes): not ops to list."""
        free = set()
        for name in names:
            n = self.g.by_name[name]
            if n["target"] in (_q(operator.getitem), "getattr", "transpose", "t") or n["target"] in TRANSPOSES:
                free.add(name)
        return free

    def _rows_group(self, name: str, a: Anchor) -> None:
        shape, dtype = self.g.tensor(a.x)
        if a.family == "reduction" and a.dim is None:
            main_view, dims = {"view": "flat"}, {"M": 1, "N": math.prod(shape)}
        elif a.family == "reduction":
            main_view = {"view": "rows", "contiguous": True}
            if a.dim != len(shape) - 1:
                main_view["dim"] = a.dim
            dims = {"M": math.prod(shape) // shape[a.dim], "N": shape[a.dim]}
        else:
            main_view, dims = {"view": "rows", "contiguous": True}, {"M": math.prod(shape) // shape[-1], "N": shape[-1]}
        # vector operands run along the kernel's last dim: only when x's last dim stays last
        vector_ok = main_view == {"view": "rows", "contiguous": True}
        full = {"view": "like", "of": "main"}
        links = self._walk_back(a.x, shape, dtype, full, vector_ok)
        b = _Builder(self.g, NodeRef(links[0][1]) if links else a.x, dtype)
        b.inputs.append({"arg": 0, **main_view})
        prologue = []
        for node, running in links:
            prologue += self._step(node, running, b, shape, full, vector_ok)
            b.nodes.append(node)
        b.nodes += [name, *a.covers]
        for v in a.vectors:
            if self._ref_tensor(v) != ([shape[-1]], dtype):
                self.why[name] = f"the {a.op} weight is not a [{shape[-1]}] {dtype} vector"
                return
            b.inputs.append({"arg": b.arg(v), "view": "vector"})
        epilogue, last = [], a.out
        if a.family != "reduction":
            epilogue, last = self._extend(a.out, b, shape, full, vector_ok)
        params = dict(a.params)
        if prologue:
            params["prologue"] = prologue
        if epilogue:
            params["epilogue"] = epilogue
        out = {"kind": "reduced", "dim": a.dim, "keepdim": a.keepdim} if a.family == "reduction" else {"kind": "same"}
        self._finish(a.family, a.op, dims, params, b, out, a.replaces if last == a.out else [last])

    def _matmul_group(self, name: str, a: Anchor) -> None:
        sa, dtype = self.g.tensor(a.x)
        tb = self._ref_tensor(a.b)
        if tb is None or tb[1] != dtype:
            self.why[name] = "the weight's dtype differs from the input's"
            return
        sb = tb[0]
        n_dim, k_b = (sb[-2], sb[-1]) if a.b_nk else (sb[-1], sb[-2])
        if k_b != sa[-1]:
            self.why[name] = "inner dims do not match"
            return
        batched = a.op == "bmm"
        b = _Builder(self.g, a.x, dtype)
        b.inputs += [{"arg": 0, "view": "batched" if batched else "rows"},
                     {"arg": b.arg(a.b), "view": "batched" if batched else "as_is"}]
        b.nodes += [name, *a.covers]
        epilogue = []
        if a.bias is not None:
            if self._ref_tensor(a.bias) != ([n_dim], dtype):
                self.why[name] = f"the bias is not a [{n_dim}] {dtype} vector"
                return
            epilogue.append({"op": "bias"})
            b.inputs.append({"arg": b.arg(a.bias), "view": "vector"})
        more, last = self._extend(name, b, [*sa[:-1], n_dim], {"view": "like", "of": "out"}, vector_ok=True)
        epilogue += more
        if batched:
            dims = {"B": math.prod(sa[:-2]), "M": sa[-2], "N": n_dim, "K": sa[-1]}
        else:
            dims = {"M": math.prod(sa[:-1]), "N": n_dim, "K": sa[-1]}
        params = {"b_layout": "nk" if a.b_nk else "kn", **({"epilogue": epilogue} if epilogue else {})}
        self._finish("matmul", a.op, dims, params, b, {"kind": "bmm" if batched else "matmul", "b_nk": a.b_nk},
                     [last])

    def _chain_group(self, name: str, s: Pointwise) -> None:
        out = self.g.tensor(name)
        if out is None or out[1] not in DTYPES or not out[0] or math.prod(out[0]) == 0:
            return
        shape, dtype = out
        full = {"view": "like", "of": "main"}
        for main in [r for r in s.inputs if isinstance(r, NodeRef) and self.g.tensor(r) == (shape, dtype)]:
            b = _Builder(self.g, main, dtype)
            b.inputs.append({"arg": 0, "view": "rows"})
            steps = self._step(name, main.name, b, shape, full, vector_ok=True)
            if steps is not None:
                break
        else:
            return
        b.nodes.append(name)
        more, last = self._extend(name, b, shape, full, vector_ok=True)
        chain = steps + more
        if not chain:  # only no-ops (contiguous, dropout(p=0)): nothing to compute
            return
        self._finish("elementwise", "chain", {"M": math.prod(shape) // shape[-1], "N": shape[-1]},
                     {"chain": chain}, b, {"kind": "same"}, [last])

    def run(self) -> list[Group]:
        names = [n["name"] for n in self.g.nodes]
        self._rmsnorm_patterns()
        for name in names:  # anchors first, in graph order, each taking its prologue and epilogue
            a = self.sem.get(name)
            if isinstance(a, Anchor) and name not in self.taken:
                (self._matmul_group if a.family == "matmul" else self._rows_group)(name, a)
        for name in names:  # then chains of what is left
            s = self.sem.get(name)
            if isinstance(s, Pointwise) and name not in self.taken:
                self._chain_group(name, s)
        return self.groups

    # -- a hand-written RMSNorm: x * rsqrt(mean(x^2, -1, keepdim) + eps) [* weight] --------
    def _rmsnorm_patterns(self) -> None:
        for n in self.g.nodes:
            found = self._match_rmsnorm(n["name"])
            if found:
                self.sem[found.out] = found
                for c in found.covers:
                    self.sem.pop(c, None)

    def _is(self, name: str, kind: str) -> bool:
        n = self.g.by_name[name]
        return (n["op"] == "call_function" and n["target"] in {"rsqrt": RSQRT, "sqrt": SQRT}[kind]) or \
               (n["op"] == "call_method" and n["target"] == kind)

    def _match_rmsnorm(self, name: str) -> Anchor | None:
        """When `name` is the multiply by rsqrt(...) of a hand-written RMSNorm, the norm anchor
        (taking the weight multiply after it, if there is one)."""
        s = self.sem.get(name)
        if not isinstance(s, Pointwise) or s.binop != "mul":
            return None
        for x, r in (s.inputs, s.inputs[::-1]):
            if not (isinstance(x, NodeRef) and isinstance(r, NodeRef)) or not self._is(r.name, "rsqrt"):
                continue
            add = self.g.args(r.name)[0][0]
            add_sem = self.sem.get(add.name) if isinstance(add, NodeRef) else None
            if not isinstance(add_sem, Pointwise) or add_sem.binop != "add":
                continue
            var, eps = add_sem.inputs if isinstance(add_sem.inputs[0], NodeRef) else add_sem.inputs[::-1]
            mean = self.sem.get(var.name) if isinstance(var, NodeRef) else None
            if not (isinstance(mean, Anchor) and mean.family == "reduction" and mean.op == "mean" and mean.keepdim):
                continue
            xt = self.g.tensor(x)
            if xt is None or mean.dim != len(xt[0]) - 1 or self.g.number(eps) is None:
                continue
            sq = self.sem.get(mean.x.name)
            if not (isinstance(sq, Pointwise) and (sq.steps == [{"op": "square"}] and sq.inputs[0] == x
                                                   or sq.binop == "mul" and sq.inputs == [x, x])):
                continue
            inner = [mean.x.name, var.name, add.name, r.name]
            if any(len(self.g.users[i]) != 1 for i in inner) or isinstance(eps, NodeRef):
                continue
            anchor = Anchor("norm", "rmsnorm", x, params={"eps": self.g.number(eps), "affine": False},
                            covers=inner, out=name, replaces=[name])
            w_user = self._single_user(name)
            w_sem = self.sem.get(w_user) if w_user else None
            if isinstance(w_sem, Pointwise) and w_sem.binop == "mul" and w_sem.inputs.count(NodeRef(name)) == 1:
                w = next(v for v in w_sem.inputs if v != NodeRef(name))
                if isinstance(w, NodeRef) and self.g.tensor(w) == ([xt[0][-1]], xt[1]):
                    anchor.params["affine"], anchor.vectors = True, [w]
                    anchor.covers = [*inner, name]
                    anchor.out, anchor.replaces = w_user, [w_user]
            return anchor
        return None

    def torch_ops(self) -> list[dict]:
        """Nodes left to PyTorch that compute something (views, sizes and selections are free)."""
        free = {"view", "reshape", "permute", "transpose", "contiguous", "flatten", "unsqueeze", "squeeze",
                "expand", "t", "size", "dim", "chunk", "split", "unbind", "getitem", "getattr", "type_as",
                "expand_as", "view_as", "reshape_as"}
        left = []
        for n in self.g.nodes:
            name = n["name"]
            if name in self.taken or n["op"] in ("placeholder", "output", "get_attr") or self.g.tensor(name) is None:
                continue
            if n["target"].rsplit(".", 1)[-1].rstrip("_") in free:
                continue
            why = self.why.get(name) or ("outside the kernel catalog" if name not in self.sem
                                         else "nothing to fuse it with")
            left.append({"node": name, "graph": self.g.path, "op": self.g.words(name), "why": why})
        return left


@dataclass
class Partition:
    groups: list[Group]
    torch_ops: list[dict]

    def to_dict(self) -> dict:
        return {"groups": [g.to_dict() for g in self.groups], "torch_ops": self.torch_ops}


def partition(captured: dict) -> Partition:
    """Fusion groups of every captured graph (kernels.capture's result), ids unique across them."""
    groups, left = [], []
    for desc in captured["graphs"]:
        p = Partitioner(desc, first_id=len(groups))
        groups += p.run()
        left += p.torch_ops()
    return Partition(groups, left)
