"""Normalizations in a captured graph: batch, group and instance norms (modules and F.*
functions), layer / RMS norms over several trailing dims, and the hand-written normalizations
x / torch.norm(x, p='fro'), x / x.norm(p=2, dim=-1, keepdim=True), x / x.abs().sum(-1, keepdim=True),
F.normalize and a layer norm written out over the last dim; each becomes a "norm" group with the
pointwise tail after it as its epilogue.

A channel norm's group reads x as [N, C, S] (S: the spatial sizes' product).  Batch norm in
training mode updates the module's running buffers as PyTorch does: the wrapper passes them to
launch() as keywords (module.assemble's out "kwargs"), and checks the module is still in the
mode it was built for.  Near misses get a Reject with the reason.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtmc.module.fx_ops import RSQRT, SQRT, Anchor, NodeRef, Pointwise, Reject, _arg, _cls, q

BATCH_NORM_MODULES = {_cls(c) for c in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)}
INSTANCE_NORM_MODULES = {_cls(c) for c in (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)}
GROUP_NORM_MODULE = _cls(nn.GroupNorm)
BATCH_NORM, GROUP_NORM, INSTANCE_NORM, NORMALIZE = q(F.batch_norm), q(F.group_norm), q(F.instance_norm), q(F.normalize)
NORM_FUNCTIONS = {q(torch.norm), q(torch.linalg.norm), q(torch.linalg.vector_norm)}
SUM_FUNCTIONS = {q(torch.sum)}
ABS_FUNCTIONS = {q(torch.abs), q(operator.abs)}
DIV_FUNCTIONS = {q(operator.truediv), q(torch.div)}
ROW_OPS = ("layernorm", "rmsnorm", "l1norm", "l2norm")
ROOTS = {"sqrt": SQRT, "rsqrt": RSQRT}


# -- classifying ----------------------------------------------------------------------------------

def _channels(c, x, op: str, num_features=None) -> tuple[list[int], str]:
    shape, dtype = c._float_tensor(x, f"the {op} input")
    if len(shape) < 2:
        raise Reject(f"{op} of a {len(shape)}-d input; kernels take [N, C, *spatial]")
    if num_features is not None and shape[1] != num_features:
        raise Reject(f"{op} of {num_features} channels on an input with {shape[1]}")
    return shape, dtype


def _number(c, v, what: str, default=None):
    if v is None:
        return default
    n = c.g.number(v)
    if n is None:
        raise Reject(f"{what} is not a constant number")
    return n


def _batch_norm(c, name: str, x, weight, bias, rm, rv, nbt, training, momentum, eps, num_features=None) -> Anchor:
    shape, _ = _channels(c, x, "batch norm", num_features)
    if not isinstance(training, bool):
        raise Reject("batch norm whose training flag is computed at run time is not fused")
    tracked = rm is not None and rv is not None
    if (rm is None) != (rv is None):
        raise Reject("batch norm with only one of running_mean / running_var")
    if momentum is not None and c.g.number(momentum) is None:
        raise Reject("batch norm momentum is not a constant number")
    if training and math.prod(shape) // shape[1] < 2:
        raise Reject("batch norm in training mode needs more than one value per channel")
    params = {"eps": float(_number(c, eps, "eps", 1e-5)), "affine": weight is not None, "training": training,
              "momentum": None if momentum is None else float(c.g.number(momentum)), "track_running_stats": tracked}
    if weight is None and bias is not None:
        raise Reject("batch norm with a bias but no weight is not in the catalog")
    state = {"running_mean": rm, "running_var": rv, "num_batches_tracked": nbt} if tracked else {}
    return Anchor("norm", "batchnorm", x, params=params, vectors=[v for v in (weight, bias) if v is not None],
                  out=name, replaces=[name], state=state)


def _group_norm(c, name: str, x, groups, weight, bias, eps, instance: bool = False) -> Anchor:
    op = "instancenorm" if instance else "groupnorm"
    shape, _ = _channels(c, x, op.replace("norm", " norm"))
    if weight is None and bias is not None:
        raise Reject(f"{op} with a bias but no weight is not in the catalog")
    params = {"eps": float(_number(c, eps, "eps", 1e-5)), "affine": weight is not None}
    if not instance:
        if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or shape[1] % groups:
            raise Reject(f"group norm with {groups!r} groups over {shape[1]} channels")
        params["groups"] = groups
    elif math.prod(shape[2:]) < 1:
        raise Reject("instance norm of an input with no spatial elements")
    return Anchor("norm", op, x, params=params, vectors=[v for v in (weight, bias) if v is not None],
                  out=name, replaces=[name])


def classify_call(c, name: str, fn: str | None, args: tuple, kwargs: dict) -> Anchor | None:
    if fn == BATCH_NORM:
        a = lambda i, k, d=None: _arg(args, kwargs, i, k, d)  # noqa: E731
        return _batch_norm(c, name, a(0, "input"), a(3, "weight"), a(4, "bias"), a(1, "running_mean"),
                           a(2, "running_var"), None, a(5, "training", False), a(6, "momentum", 0.1), a(7, "eps", 1e-5))
    if fn == GROUP_NORM:
        return _group_norm(c, name, args[0], _arg(args, kwargs, 1, "num_groups"), _arg(args, kwargs, 2, "weight"),
                           _arg(args, kwargs, 3, "bias"), _arg(args, kwargs, 4, "eps", 1e-5))
    if fn == INSTANCE_NORM:
        if _arg(args, kwargs, 1, "running_mean") is not None or _arg(args, kwargs, 2, "running_var") is not None:
            raise Reject("instance norm with running statistics is not in the catalog")
        if _arg(args, kwargs, 5, "use_input_stats", True) is not True:
            raise Reject("instance norm without input statistics is not in the catalog")
        return _group_norm(c, name, args[0], None, _arg(args, kwargs, 3, "weight"), _arg(args, kwargs, 4, "bias"),
                           _arg(args, kwargs, 7, "eps", 1e-5), instance=True)
    if fn == NORMALIZE:
        return _normalize(c, name, args[0], _arg(args, kwargs, 1, "p", 2.0), _arg(args, kwargs, 2, "dim", 1),
                          _arg(args, kwargs, 3, "eps", 1e-12))
    return None


def classify_module(c, name: str, target: str, info: dict, x) -> Anchor | None:
    kind, attrs, params = info.get("type", ""), info.get("attrs", {}), info.get("params", {})
    ref = lambda p: {"attr": f"{target}.{p}"} if p in params else None  # noqa: E731
    if kind in BATCH_NORM_MODULES:
        training = bool(attrs.get("training", True))
        tracked = attrs.get("track_running_stats", True) and "running_mean" in params
        a = _batch_norm(c, name, x, ref("weight"), ref("bias"), ref("running_mean") if tracked else None,
                        ref("running_var") if tracked else None, ref("num_batches_tracked") if tracked else None,
                        training or not tracked, attrs.get("momentum", 0.1), attrs.get("eps", 1e-5),
                        attrs.get("num_features"))
        a.state["training_attr"] = {"attr": f"{target}.training", "value": training}
        shape, _ = c.g.tensor(x)
        rank = {_cls(nn.BatchNorm1d): (2, 3), _cls(nn.BatchNorm2d): (4,), _cls(nn.BatchNorm3d): (5,)}[kind]
        if len(shape) not in rank:
            raise Reject(f"{kind.rsplit('.', 1)[-1]} of a {len(shape)}-d input")
        return a
    if kind == GROUP_NORM_MODULE:
        return _group_norm(c, name, x, attrs.get("num_groups"), ref("weight"), ref("bias"), attrs.get("eps", 1e-5))
    if kind in INSTANCE_NORM_MODULES:
        if attrs.get("track_running_stats"):
            raise Reject("instance norm with track_running_stats=True is not in the catalog")
        shape, _ = c.g.tensor(x) or ([], "")
        rank = {_cls(nn.InstanceNorm1d): 3, _cls(nn.InstanceNorm2d): 4, _cls(nn.InstanceNorm3d): 5}[kind]
        if len(shape) != rank:
            raise Reject(f"{kind.rsplit('.', 1)[-1]} of an unbatched {len(shape)}-d input")
        return _group_norm(c, name, x, None, ref("weight"), ref("bias"), attrs.get("eps", 1e-5), instance=True)
    return None


def _last_dim(shape: list[int], dim) -> bool:
    """Whether reducing over `dim` is reducing over the last dim (trailing size-1 dims allowed)."""
    if not isinstance(dim, int) or isinstance(dim, bool) or not shape:
        return False
    d = dim % len(shape)
    return all(s == 1 for s in shape[d + 1:])


def _normalize(c, name: str, x, p, dim, eps) -> Anchor:
    shape, _ = c._float_tensor(x, "the input")
    if p not in (1, 2, 1.0, 2.0):
        raise Reject(f"F.normalize with p={p!r}; the catalog has p=1 and p=2")
    d = _norm_dim(shape, dim)
    if d == -1:
        raise Reject(f"F.normalize over dim {dim!r} of a {shape} tensor")
    op = "l2norm" if p in (2, 2.0) else "l1norm"
    return Anchor("norm", op, x, params={"eps": float(_number(c, eps, "eps", 1e-12))}, out=name, replaces=[name],
                  dim=d)


def _norm_dim(shape: list[int], dim) -> int | None:
    """The dim a row normalization runs over: None for the last (trailing size-1 dims allowed),
    else the middle dim, read in place as the strided [M / Q, N, Q] layout; -1 when not one dim."""
    if _last_dim(shape, dim):
        return None
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int) or isinstance(dim, bool) or not -len(shape) <= dim < len(shape):
        return -1
    return dim % len(shape)


# -- hand-written normalizations: x / norm(x) -------------------------------------------------------

def _node_is(g, name: str, functions: set, method: str) -> bool:
    n = g.by_name[name]
    return (n["op"] == "call_function" and n["target"] in functions) or (n["op"] == "call_method" and n["target"] == method)


def _norm_of(p, den: str, x: NodeRef):
    """(op, covered nodes) when node `den` is a norm of x that normalizes it when x is divided by it."""
    g = p.g
    args, kwargs = g.args(den)
    shape = g.tensor(x)[0]
    if _node_is(g, den, NORM_FUNCTIONS, "norm") and args and args[0] == x:
        fn = g.by_name[den]["target"]
        linalg = fn in (q(torch.linalg.norm), q(torch.linalg.vector_norm))
        default = 2 if fn == q(torch.linalg.vector_norm) else None if linalg else "fro"
        order = _arg(args, kwargs, 1, "ord" if linalg else "p", default)
        dim, keepdim = _arg(args, kwargs, 2, "dim"), _arg(args, kwargs, 3, "keepdim", False)
        if dim is None:   # one norm of every element (linalg.norm's ord=2 of a matrix is spectral)
            whole = order in ("fro", None) or (order in (2, 2.0) and fn != q(torch.linalg.norm))
            return ("frobenius", [], None) if whole else None
        d = _norm_dim(shape, dim)
        if keepdim and d != -1 and order in (1, 1.0, 2, 2.0):
            return ("l1norm" if order in (1, 1.0) else "l2norm"), [], d
        return None
    # x.abs().sum(dim, keepdim=True)
    if _node_is(g, den, SUM_FUNCTIONS, "sum") and isinstance(args[0], NodeRef):
        a = args[0].name
        a_args, _ = g.args(a)
        dim, keepdim = _arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 2, "keepdim", False)
        d = _norm_dim(shape, dim)
        if (_node_is(g, a, ABS_FUNCTIONS, "abs") and a_args and a_args[0] == x and keepdim and d != -1
                and g.users[a] == [den]):
            return "l1norm", [a], d
    # torch.sqrt(torch.mean(x ** 2, dim, keepdim=True) + eps): a hand-written RMSNorm
    rms = _rms_of(p, den, x, "sqrt")
    return ("rmsnorm", *rms) if rms else None


def _rms_of(p, node: str, x: NodeRef, root: str):
    """(covered nodes, dim, eps) when `node` is sqrt (or rsqrt) of mean(x^2, dim, keepdim) + eps."""
    g = p.g
    if not _node_is(g, node, ROOTS[root], root):
        return None
    add = g.args(node)[0][0]
    add_sem = p.sem.get(add.name) if isinstance(add, NodeRef) else None
    if not isinstance(add_sem, Pointwise) or add_sem.binop != "add":
        return None
    var, eps = add_sem.inputs if isinstance(add_sem.inputs[0], NodeRef) else add_sem.inputs[::-1]
    mean = p.sem.get(var.name) if isinstance(var, NodeRef) else None
    if not (isinstance(mean, Anchor) and mean.family == "reduction" and mean.op == "mean" and mean.keepdim
            and mean.dim is not None) or isinstance(eps, NodeRef) or g.number(eps) is None:
        return None
    sq = p.sem.get(mean.x.name)
    if not (isinstance(sq, Pointwise) and (sq.steps == [{"op": "square"}] and sq.inputs[0] == x
                                           or sq.binop == "mul" and sq.inputs == [x, x])):
        return None
    inner = [mean.x.name, var.name, add.name]
    if any(len(g.users[i]) != 1 for i in inner):
        return None
    d = _norm_dim(g.tensor(x)[0], mean.dim)
    return inner, d, g.number(eps)


def _centered(p, ref) -> tuple[NodeRef, str, int] | None:
    """(x, the mean node, its dim) when `ref` is x - mean(x, dim, keepdim=True)."""
    s = p.sem.get(ref.name) if isinstance(ref, NodeRef) else None
    if not (isinstance(s, Pointwise) and s.binop == "sub" and all(isinstance(v, NodeRef) for v in s.inputs)):
        return None
    x, m = s.inputs
    mean = p.sem.get(m.name)
    if (isinstance(mean, Anchor) and mean.family == "reduction" and mean.op == "mean" and mean.keepdim
            and mean.x == x and isinstance(mean.dim, int) and not mean.pre and not mean.post):
        return x, m.name, mean.dim
    return None


def _layer_norm_of(p, num, den: str, root: str, out: str):
    """(x, covered nodes, eps) when num / den (num * den for rsqrt) is a layer norm written out over
    the last dim: (x - mean(x, -1, keepdim)) / sqrt(var + eps), var being mean((x - mean) ** 2, -1,
    keepdim) or x.var(-1, keepdim, correction=0) (ConvNeXt's, minGPT-style code's)."""
    g = p.g
    centered = _centered(p, num)
    if centered is None or not _node_is(g, den, ROOTS[root], root):
        return None
    x, m, dim = centered
    add = g.args(den)[0][0]
    add_sem = p.sem.get(add.name) if isinstance(add, NodeRef) else None
    if not isinstance(add_sem, Pointwise) or add_sem.binop != "add":
        return None
    var, eps = add_sem.inputs if isinstance(add_sem.inputs[0], NodeRef) else add_sem.inputs[::-1]
    if not isinstance(var, NodeRef) or isinstance(eps, NodeRef) or g.number(eps) is None:
        return None
    v = p.sem.get(var.name)
    if not (isinstance(v, Anchor) and v.family == "reduction" and v.keepdim and v.dim == dim and not v.post):
        return None
    inner = [m, num.name, add.name, var.name]
    if v.op == "var" and v.params.get("correction") == 0 and v.x == x and not v.pre:
        pass
    elif v.op == "mean" and not v.pre:
        sq = p.sem.get(v.x.name)
        c = sq.inputs[0] if isinstance(sq, Pointwise) and (sq.steps == [{"op": "square"}] or
                                                            sq.binop == "mul" and sq.inputs[0] == sq.inputs[1]) else None
        again = _centered(p, c) if c is not None and c != num else None
        if c is None or (c != num and (again is None or again[:2] != (x, m))):
            return None
        inner += [v.x.name] + ([c.name] if c != num else [])
    else:
        return None
    if _norm_dim(g.tensor(x)[0], dim) is not None:
        return None   # over a middle dim: the norm kernels' strided layout has no layer norm yet
    allowed = set(inner) | {den, out}
    if any(set(g.users[i]) - allowed for i in inner):   # a part read elsewhere (the mean returned too)
        return None
    return x, inner, g.number(eps)


def normalization_patterns(p) -> None:
    """Mark x / norm(x) nodes as norm anchors (before groups are formed)."""
    g = p.g
    for n in g.nodes:
        name = n["name"]
        if n["op"] not in ("call_function", "call_method") or not (
                n["target"] in DIV_FUNCTIONS or (n["op"] == "call_method" and n["target"] == "div")):
            continue
        args, kwargs = g.args(name)
        if len(args) < 2 or kwargs.get("rounding_mode") or not all(isinstance(v, NodeRef) for v in args[:2]):
            continue
        x, den = args[:2]
        xt = g.tensor(x)
        if xt is None or g.tensor(name) != xt or len(g.users[den.name]) != 1:
            continue
        ln = _layer_norm_of(p, x, den.name, "sqrt", name)
        if ln is not None:
            _mark(p, name, ln[0], den.name, "layernorm", ln[1], None, ln[2])
            continue
        found = _norm_of(p, den.name, x)
        if found is not None:
            _mark(p, name, x, den.name, *found)
    for n in g.nodes:   # x * rsqrt(mean(x^2, dim) + eps) over a middle dim (the last: module.fusion's)
        name, s = n["name"], p.sem.get(n["name"])
        if not isinstance(s, Pointwise) or s.binop != "mul" or not all(isinstance(v, NodeRef) for v in s.inputs):
            continue
        for x, r in (s.inputs, s.inputs[::-1]):
            ln = _layer_norm_of(p, x, r.name, "rsqrt", name) if len(g.users[r.name]) == 1 else None
            if ln is not None and g.tensor(name) == g.tensor(x):
                _mark(p, name, ln[0], r.name, "layernorm", ln[1], None, ln[2])
                break
            rms = _rms_of(p, r.name, x, "rsqrt") if len(g.users[r.name]) == 1 else None
            if rms and rms[1] is not None and g.tensor(name) == g.tensor(x):
                _mark(p, name, x, r.name, "rmsnorm", *rms)
                break


def _mark(p, name: str, x: NodeRef, den: str, op: str, covers: list, dim, eps: float = 0.0) -> None:
    """Node `name` (x divided or multiplied by `den`) becomes a norm anchor covering den and covers."""
    params = {"eps": float(eps), **({"affine": False} if op in ("rmsnorm", "layernorm") else {})}
    p.sem[name] = Anchor("norm", op, x, params=params, covers=[den, *covers], out=name, replaces=[name], dim=dim)
    for c in [den, *covers]:
        p.sem.pop(c, None)
        p.why.pop(c, None)


# -- building the group -----------------------------------------------------------------------------

def build(p, name: str, a: Anchor) -> None:
    """The group around norm anchor `a` (a Partitioner's method in all but name)."""
    shape, dtype = p.g.tensor(a.x)
    trailing = a.state.get("trailing", 1)
    if a.op in ROW_OPS and trailing == 1 and a.dim is None:
        p._rows_group(name, a)       # over the last dim: the row-wise group, prologue and all
        return
    channels = a.dim is None and a.op not in ROW_OPS and a.op != "frobenius"
    # a channel norm applies the operand-free activation before it on its loads (a conv's tail
    # after regroup left the conv to cuDNN): one read of x instead of a pass of its own
    views = p.views_ok(name)   # read through pure views (module.view_fusion)
    b, prologue = p.free_prologue(a.x, shape, dtype, views=views) if channels else (p.builder(a.x, dtype), [])
    b.nodes += [name, *a.covers]
    if a.dim is not None:             # over a middle dim: x's buffer read in place as [M / Q, N, Q]
        dims = {"M": math.prod(shape) // shape[a.dim], "N": shape[a.dim]}
        main, vec_shape = {"view": "strided", "dim": a.dim}, [shape[a.dim]]
        a.params["inner"] = math.prod(shape[a.dim + 1:])
    elif a.op in ROW_OPS:             # layer / RMS norm over several trailing dims, flattened
        if len(shape) == trailing:
            p.why[name] = f"{a.op} over every dim of the input (no batch dim) is not fused"
            return
        dims = {"M": math.prod(shape[:-trailing]), "N": math.prod(shape[-trailing:])}
        main, vec_shape = {"view": "trailing", "dims": trailing}, shape[-trailing:]
    elif a.op == "frobenius":
        if not shape or math.prod(shape) == 0:
            p.why[name] = "Frobenius normalization of an empty or 0-d tensor"
            return
        dims = {"M": math.prod(shape[:-1]), "N": shape[-1]}
        main, vec_shape = {"view": "rows"}, None
    else:
        dims = {"N": shape[0], "C": shape[1], "S": math.prod(shape[2:])}
        main, vec_shape = {"view": "channels"}, [shape[1]]
    b.inputs.append({"arg": 0, **main, "contiguous": True})
    for v in a.vectors:
        if p._ref_tensor(v) != (vec_shape, dtype):
            p.why[name] = f"the {a.op} weight or bias is not a {vec_shape} {dtype} tensor"
            return
        b.inputs.append({"arg": b.arg(v), "view": "vector"})
    params = dict(a.params, **({"prologue": prologue} if prologue else {}))
    out = {"kind": "same"}
    if a.op == "batchnorm":
        if a.state.get("training_attr"):   # ModelNew checks the module is still in this mode
            t = a.state["training_attr"]
            b.guards.append({"arg": b.arg({"attr": t["attr"]}), "value": t["value"]})
        running = {k: v for k, v in a.state.items() if k in ("running_mean", "running_var", "num_batches_tracked")
                   and v is not None}
        if not params["training"] and params["track_running_stats"]:
            for k in ("running_mean", "running_var"):   # eval mode: the running statistics are inputs
                if p._ref_tensor(running[k]) != (vec_shape, dtype):
                    p.why[name] = f"the batch norm {k} is not a {vec_shape} {dtype} tensor"
                    return
                b.inputs.append({"arg": b.arg(running[k]), "view": "vector"})
        elif running:                                   # training mode: updated in place by the kernel
            out["kwargs"] = {k: b.arg(v) for k, v in running.items()}
    epilogue, last = p._extend(a.out, b, shape, {"view": "like", "of": "main"}, vector_ok=False, views=views)
    if epilogue:
        params["epilogue"] = epilogue
    p._finish("norm", a.op, dims, params, b, out, a.replaces if last == a.out else [last])
