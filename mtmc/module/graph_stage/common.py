"""What the rewrites share: reading linear maps (nn.Linear, F.linear, x @ W, convolutions) and
reductions out of a captured graph, and the affine chain between them."""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtmc.module.functionalize import changes_in_place
from mtmc.module.fx_ops import Classifier, Graph, NodeRef, Pointwise, Reject, _arg, _cls, q

EXACT_DTYPES = ("float32", "float64")
SUM_MEAN = {q(torch.sum): "sum", q(torch.mean): "mean"}
LINEAR_MODULE = _cls(nn.Linear)
CONV_MODULES = {_cls(c): (c.__name__.lower().replace("convtranspose", "conv_transpose"), r)
                for c, r in [(nn.Conv1d, 1), (nn.Conv2d, 2), (nn.Conv3d, 3), (nn.ConvTranspose1d, 1),
                             (nn.ConvTranspose2d, 2), (nn.ConvTranspose3d, 3)]}
CONV_FUNCTIONS = {q(f): (f.__name__, r) for f, r in [
    (F.conv1d, 1), (F.conv2d, 2), (F.conv3d, 3), (F.conv_transpose1d, 1), (F.conv_transpose2d, 2),
    (F.conv_transpose3d, 3)]}
MATMULS = {q(torch.matmul), q(operator.matmul), q(torch.mm)}


@dataclass
class LinearMap:
    """y = x W^T + b (or a conv): where its weight and bias come from.  weight / bias: a NodeRef,
    or {"attr": path} of a parameter; feature_dim: y's dim that holds the map's outputs."""
    node: str
    kind: str                 # "linear" | "matmul" (W stored [K, N]) | a conv op name
    x: NodeRef
    weight: object
    weight_shape: list[int]
    bias: object
    out_shape: list[int]
    dtype: str
    feature_dim: int
    conv: dict | None = None  # a conv's stride, padding, dilation, groups, output_padding, padding_mode

    @property
    def n(self) -> int:
        return self.out_shape[self.feature_dim]


def _param_shape(g: Graph, module: str, name: str):
    p = g.modules.get(module, {}).get("params", {}).get(name)
    return list(p["shape"]) if p else None


def linear_map(g: Graph, name: str) -> LinearMap | None:
    """The linear map `name` computes (nn.Linear, F.linear, x @ W with a 2-D W, a convolution),
    or None."""
    n = g.by_name[name]
    out = g.tensor(name)
    if out is None:
        return None
    args, kwargs = g.args(name)
    if n["op"] == "call_module":
        info = g.modules.get(n["target"], {})
        kind, attrs = info.get("type", ""), info.get("attrs", {})
        x = args[0] if args else None
        if not isinstance(x, NodeRef):
            return None
        w = {"attr": f"{n['target']}.weight"}
        b = {"attr": f"{n['target']}.bias"} if "bias" in info.get("params", {}) else None
        wshape = _param_shape(g, n["target"], "weight")
        if kind == LINEAR_MODULE:
            return LinearMap(name, "linear", x, w, wshape, b, out[0], out[1], len(out[0]) - 1)
        if kind in CONV_MODULES:
            op, r = CONV_MODULES[kind]
            conv = {k: attrs.get(k) for k in ("stride", "padding", "dilation", "groups", "output_padding",
                                              "padding_mode")}
            return LinearMap(name, op, x, w, wshape, b, out[0], out[1], 1, conv)
        return None
    if n["op"] != "call_function":
        return None
    fn = n["target"]
    if fn == q(F.linear):
        x, w, b = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight"), _arg(args, kwargs, 2, "bias")
        if isinstance(x, NodeRef) and isinstance(w, NodeRef) and g.tensor(w) and len(g.tensor(w)[0]) == 2:
            return LinearMap(name, "linear", x, w, g.tensor(w)[0], b if isinstance(b, NodeRef) else None,
                             out[0], out[1], len(out[0]) - 1)
    if fn in MATMULS:
        x, w = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "other", kwargs.get("mat2"))
        if isinstance(x, NodeRef) and isinstance(w, NodeRef) and g.tensor(w) and len(g.tensor(w)[0]) == 2 \
                and g.tensor(x) and len(g.tensor(x)[0]) >= 2:
            src = Classifier(g)._transposed(w)   # x @ W.T (W [N, K], read as nn.Linear's weight)
            if src is not None and g.tensor(src) and len(g.tensor(src)[0]) == 2:
                return LinearMap(name, "linear", x, src, g.tensor(src)[0], None, out[0], out[1], len(out[0]) - 1)
            return LinearMap(name, "matmul", x, w, g.tensor(w)[0], None, out[0], out[1], len(out[0]) - 1)
    if fn in CONV_FUNCTIONS:
        op, r = CONV_FUNCTIONS[fn]
        x, w, b = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight"), _arg(args, kwargs, 2, "bias")
        if not (isinstance(x, NodeRef) and isinstance(w, NodeRef) and g.tensor(w)):
            return None
        names = (["stride", "padding", "output_padding", "groups", "dilation"] if "transpose" in op
                 else ["stride", "padding", "dilation", "groups"])
        defaults = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "output_padding": 0}
        conv = {k: _arg(args, kwargs, 3 + i, k, defaults[k]) for i, k in enumerate(names)}
        conv["padding_mode"] = "zeros"
        return LinearMap(name, op, x, w, g.tensor(w)[0], b if isinstance(b, NodeRef) else None, out[0], out[1], 1,
                         conv)
    return None


@dataclass
class Reduction:
    node: str
    op: str                   # sum | mean
    x: NodeRef
    dims: list[int]           # normalized, sorted; [] never (None: every dim -> all dims)
    keepdim: bool
    every: bool               # dim=None (all dims)


def _global_average(g: Graph, name: str) -> Reduction | None:
    """An adaptive average pool to one position per channel (nn.AdaptiveAvgPool2d(1),
    F.adaptive_avg_pool3d(x, (1, 1, 1))): a mean over every position, keepdim."""
    from mtmc.module.pool_fusion import POOL_FUNCTIONS, POOL_MODULES
    n = g.by_name[name]
    args, kwargs = g.args(name)
    if n["op"] == "call_module":
        info = g.modules.get(n["target"], {})
        op = POOL_MODULES.get(info.get("type", ""), "")
        size = info.get("attrs", {}).get("output_size")
    elif n["op"] == "call_function":
        op = POOL_FUNCTIONS.get(n["target"], ("",))[0]
        size = _arg(args, kwargs, 1, "output_size")
    else:
        return None
    if not op.startswith("adaptive_avg"):
        return None
    x = args[0] if args else None
    t = g.tensor(x) if isinstance(x, NodeRef) else None
    r = int(op[-2])   # adaptive_avg_pool2d: the last 2 dims (an unbatched input has no batch dim)
    if t is None or len(t[0]) < r + 1 or not all(v == 1 for v in (size if isinstance(size, (list, tuple)) else [size])):
        return None
    nd = len(t[0])
    return Reduction(name, "mean", x, list(range(nd - r, nd)), True, False)


def reduction(g: Graph, name: str) -> Reduction | None | str:
    """The sum or mean `name` computes (a global average pool is a mean over the positions), None
    when it is neither, or a reason string when it is one in a form the rewrites do not take (a
    dtype= cast)."""
    pooled = _global_average(g, name)
    if pooled is not None:
        return pooled
    n = g.by_name[name]
    op = SUM_MEAN.get(n["target"]) if n["op"] == "call_function" else (
        n["target"] if n["op"] == "call_method" and n["target"] in ("sum", "mean") else None)
    if op is None:
        return None
    args, kwargs = g.args(name)
    x = args[0] if args else None
    t = g.tensor(x) if isinstance(x, NodeRef) else None
    if t is None or g.tensor(name) is None:
        return None
    if kwargs.get("dtype") is not None or kwargs.get("out") is not None:
        return f"{op} with a dtype= or out= argument"
    dim = _arg(args, kwargs, 1, "dim")
    keepdim = _arg(args, kwargs, 2, "keepdim", False)
    if not isinstance(keepdim, bool):
        return f"{op} with a keepdim computed at run time"
    nd = len(t[0])
    if dim is None or dim == [] or dim == ():
        return Reduction(name, op, x, list(range(nd)), keepdim, True)
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return f"{op} over dims computed at run time"
    return Reduction(name, op, x, sorted({d % nd for d in dims}), keepdim, False)


# -- the affine chain between a linear map and what reads it -----------------------------------------

AFFINE_BINOPS = {"add", "sub", "mul", "div"}


@dataclass
class Step:
    node: str
    op: str                   # add | sub | rsub | mul | div | neg
    other: object             # a float, or a NodeRef of a tensor constant along the other dims


def classify(g: Graph, name: str):
    try:
        return Classifier(g)(name)
    except Reject:
        return None
    except Exception:
        return None


def per_feature(g: Graph, other, out_shape: list[int], feature_dim: int) -> bool:
    """`other` (a tensor) is constant along every dim of `out_shape` but the feature dim and
    broadcasts into it without growing it: [N], [1, N], [C, 1, 1], [1], []."""
    t = g.tensor(other)
    if t is None:
        return False
    shape = t[0]
    if len(shape) > len(out_shape):
        return False
    aligned = [1] * (len(out_shape) - len(shape)) + list(shape)
    return all(s == 1 or (i == feature_dim and s == out_shape[i]) for i, s in enumerate(aligned))


def chain_step(g: Graph, name: str, running: str, out_shape: list[int], feature_dim: int) -> Step | str:
    """The affine step `name` applies to `running` (an op of a constant along the feature dim),
    or why it is not one, in words."""
    if changes_in_place(g, name):
        return f"{g.words(name)} is an in-place op"
    s = classify(g, name)
    if not isinstance(s, Pointwise):
        return f"{g.words(name)} is not a pointwise op"
    if g.tensor(name) is None or g.tensor(name)[0] != out_shape:
        return f"{g.words(name)} changes the shape"
    if s.binop is None:
        if s.steps == [{"op": "neg"}]:
            return Step(name, "neg", None)
        if not s.steps:
            return Step(name, "mul", 1.0)   # a no-op (clone, contiguous, eval dropout)
        return f"{g.words(name)} ({', '.join(st['op'] for st in s.steps)}) is not linear"
    if s.binop not in AFFINE_BINOPS:
        return f"{g.words(name)} ({s.binop}) is not linear"
    x, y = s.inputs
    first = x == NodeRef(running)
    other = y if first else x
    if other == NodeRef(running):
        return f"{g.words(name)} reads the value twice (not linear)"
    num = g.number(other)
    if num is None:
        if not isinstance(other, NodeRef) or not per_feature(g, other, out_shape, feature_dim):
            return f"{g.words(name)} combines it with a tensor that varies along the reduced dims"
        if g.tensor(other)[1] != g.tensor(name)[1]:
            return f"{g.words(name)} mixes dtypes"
    op = s.binop
    if not first:
        if op == "sub":
            op = "rsub"
        elif op == "div":
            return f"{g.words(name)} divides by the value (not linear)"
    if op == "div" and num == 0:
        return f"{g.words(name)} divides by zero"
    return Step(name, op, num if num is not None else other)


def walk_chain(g: Graph, start: str, end: str) -> list[str] | None:
    """The nodes from `start`'s user to `end` when each value on the way has exactly one reader
    and the next node reads it; None when `end` is not reached that way."""
    path, cur = [], start
    for _ in range(32):
        users = g.users[cur]
        if len(users) != 1:
            return None
        cur = users[0]
        path.append(cur)
        if cur == end:
            return path
    return None


def feeding_map(g: Graph, x: NodeRef, limit: int = 8) -> tuple[LinearMap | None, list[str]]:
    """The linear map found walking back from x over one-input ops (x's own chain), and the
    nodes walked (in graph order)."""
    walked, cur = [], x.name
    for _ in range(limit):
        m = linear_map(g, cur)
        if m is not None:
            return m, walked[::-1]
        n = g.by_name[cur]
        if n["op"] not in ("call_function", "call_method", "call_module"):
            return None, []
        walked.append(cur)
        args, _ = g.args(cur)
        refs = [a for a in args if isinstance(a, NodeRef) and g.tensor(a) is not None
                and g.tensor(a)[0] == g.tensor(cur)[0]] if g.tensor(cur) else []
        if len(refs) > 1:   # x * y: the map may feed either
            for ref in refs:
                m, more = feeding_map(g, ref, limit - len(walked))
                if m is not None:
                    return m, more + walked[::-1]
        if len(refs) != 1:
            return None, []
        cur = refs[0].name
    return None, []
