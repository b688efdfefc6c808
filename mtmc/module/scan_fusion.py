"""Scans in a captured graph: torch.cumsum / torch.cumprod and their tensor methods become "scan"
anchors (module.fx_ops asks here), with the forms around them folded into the one kernel:

  * reverse: torch.cumsum(x.flip(d), d).flip(d) (flip or torch.flip, on the scan's dim);
  * exclusive: torch.cumsum(x, d) - x (the scan minus its own input), the scan of x shifted by
    one: torch.cumsum(torch.cat((zeros of one slice, x), d).narrow(d, 0, n), d), or the scan of x's
    first n - 1 elements with a zero put in front: torch.cat((zeros of one slice,
    torch.cumsum(x.narrow(d, 0, n - 1), d)), d) (KernelBench's exclusive cumsum since its fix);
  * masked: torch.cumsum(x * mask, d) with a bool mask of x's shape (read as a bool input);
  * the pointwise ops feeding the scan (prologue) and following it (epilogue), when the scan runs
    over the last dim; a scan over a middle dim reads x's buffer in place ("inner", as reductions).
"""
from __future__ import annotations

import math
import operator

import torch

from mtmc.module.fx_ops import Anchor, NodeRef, Pointwise, Reject, _arg, q

SCAN_FUNCTIONS = {q(torch.cumsum): "cumsum", q(torch.cumprod): "cumprod"}
SCAN_METHODS = ("cumsum", "cumprod")
FLIPS = {q(torch.flip)}
CATS = {q(torch.cat), q(torch.concat), q(torch.concatenate)}
NARROWS = {q(torch.narrow)}
ZEROS = {q(torch.zeros_like)}
MULS = {q(operator.mul), q(torch.mul)}


def _called(g, name: str, functions: set, method: str) -> bool:
    n = g.by_name[name]
    return (n["op"] == "call_function" and n["target"] in functions) or (n["op"] == "call_method"
                                                                        and n["target"] == method)


def _flip_dim(c, ref, rank: int) -> int | None:
    """d when `ref` is x.flip(d) / torch.flip(x, [d]) over that one dim."""
    if not isinstance(ref, NodeRef) or not _called(c.g, ref.name, FLIPS, "flip"):
        return None
    args, kwargs = c.g.args(ref.name)
    dims = kwargs.get("dims", list(args[1:]) if len(args) > 2 else args[1] if len(args) > 1 else None)
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    return dims[0] % rank if len(dims) == 1 and isinstance(dims[0], int) else None


def _single_user(c, name: str) -> str | None:
    users = c.g.users[name]
    return users[0] if len(users) == 1 else None


def _mask_of(c, ref, shape: list[int]):
    """(x, mask) when `ref` is x * mask with mask a bool tensor of x's shape, used only here."""
    if not isinstance(ref, NodeRef) or not _called(c.g, ref.name, MULS, "mul") or len(c.g.users[ref.name]) != 1:
        return None
    args, _ = c.g.args(ref.name)
    if len(args) != 2 or not all(isinstance(a, NodeRef) for a in args):
        return None
    for x, mask in (args, args[::-1]):
        if c.g.tensor(mask) == (shape, "bool") and c.g.tensor(x) is not None and c.g.tensor(x)[0] == shape:
            return x, mask
    return None


def _shifted(c, ref, d: int, shape: list[int]):
    """(x, the nodes of the form) when `ref` is cat((zeros of one slice along d, x), d) cut back to
    x's length by narrow(d, 0, n): x shifted by one, a zero first (KernelBench's exclusive cumsum)."""
    if not isinstance(ref, NodeRef) or not _called(c.g, ref.name, NARROWS, "narrow") or len(c.g.users[ref.name]) != 1:
        return None
    args, kwargs = c.g.args(ref.name)
    cat = args[0]
    cut = [_arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 2, "start"), _arg(args, kwargs, 3, "length")]
    if not isinstance(cat, NodeRef) or [cut[0] % len(shape) if isinstance(cut[0], int) else None, cut[1]] != [d, 0] \
            or c.g.number(cut[2]) != shape[d] or not _called(c.g, cat.name, CATS, "cat") or len(c.g.users[cat.name]) != 1:
        return None
    cargs, ckw = c.g.args(cat.name)
    parts, cdim = _arg(cargs, ckw, 0, "tensors"), _arg(cargs, ckw, 1, "dim", 0)
    if not isinstance(parts, (list, tuple)) or len(parts) != 2 or not isinstance(cdim, int) or cdim % len(shape) != d:
        return None
    zeros, x = parts
    if not isinstance(x, NodeRef) or c.g.tensor(x) is None or c.g.tensor(x)[0] != shape:
        return None
    covered = _zero_slice(c, zeros, d, shape, c.g.tensor(x)[1], [ref.name, cat.name], keep=x.name)
    return (x, covered) if covered else None


def _zero_slice(c, zeros, d: int, shape: list[int], dtype: str, covered: list[str], keep: str):
    """`covered` plus the nodes making `zeros`, when `zeros` is a zero tensor of one slice of
    `shape` along d (zeros_like(x.select(d, 0).unsqueeze(d)), ...) used only by covered nodes;
    None otherwise.  Node `keep` (the scan's input) never goes with them."""
    one = list(shape)
    one[d] = 1
    zn = c.g.by_name.get(zeros.name) if isinstance(zeros, NodeRef) else None
    made_zero = zn is not None and ((zn["op"] == "call_function" and zn["target"] in ZEROS)
                                    or (zn["op"] == "call_method" and zn["target"] in ("zero_", "new_zeros")))
    if not made_zero or len(c.g.users[zeros.name]) != 1 or c.g.tensor(zeros) != (one, dtype):
        return None
    covered = [*covered, zeros.name]
    todo = [a for a in c.g.args(zeros.name)[0] if isinstance(a, NodeRef)] if zn["target"] in ZEROS else []
    while todo:   # what only made the zeros' shape (x.select(d, 0).unsqueeze(d)) goes with them
        a = todo.pop()
        if a.name != keep and set(c.g.users[a.name]) <= set(covered) and c.g.by_name[a.name]["op"] == "call_method":
            covered.append(a.name)
            todo += [b for b in c.g.args(a.name)[0] if isinstance(b, NodeRef)]
    return covered


def _prepended(c, ref, out: str, d: int):
    """(x, the cat, the nodes of the form) when `ref` is x.narrow(d, 0, n - 1) (x's first n - 1
    elements along d, read only here) and the scan `out`'s one user is cat((zeros of one slice
    along d, out), d): the exclusive scan of x, of x's shape (KernelBench's exclusive cumsum as
    upstream writes it since its fix)."""
    if not isinstance(ref, NodeRef) or not _called(c.g, ref.name, NARROWS, "narrow") or len(c.g.users[ref.name]) != 1:
        return None
    args, kwargs = c.g.args(ref.name)
    x = args[0]
    full = c.g.tensor(x) if isinstance(x, NodeRef) else None
    if full is None or not full[0]:
        return None
    shape, dtype = full
    cut = [_arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 2, "start"), _arg(args, kwargs, 3, "length")]
    if not isinstance(cut[0], int) or isinstance(cut[0], bool) or cut[0] % len(shape) != d \
            or c.g.number(cut[1]) != 0 or c.g.number(cut[2]) != shape[d] - 1:
        return None
    cat = _single_user(c, out)
    if cat is None or not _called(c.g, cat, CATS, "cat") or c.g.tensor(cat) != (shape, dtype):
        return None
    cargs, ckw = c.g.args(cat)
    parts, cdim = _arg(cargs, ckw, 0, "tensors"), _arg(cargs, ckw, 1, "dim", 0)
    if not isinstance(parts, (list, tuple)) or len(parts) != 2 or parts[1] != NodeRef(out) \
            or not isinstance(cdim, int) or isinstance(cdim, bool) or cdim % len(shape) != d:
        return None
    covered = _zero_slice(c, parts[0], d, shape, dtype, [ref.name, cat], keep=x.name)
    return (x, cat, covered) if covered else None


def _classified(c, name: str):
    try:
        return c(name)
    except Reject:
        return None


def classify_call(c, name: str, fn: str | None, args: tuple, kwargs: dict) -> Anchor | None:
    """A scan anchor for cumsum / cumprod (function or method), None for any other call."""
    n = c.g.by_name[name]
    op = SCAN_FUNCTIONS.get(fn) or (n["target"] if n["op"] == "call_method" and n["target"] in SCAN_METHODS else None)
    if op is None:
        return None
    if kwargs.get("dtype") is not None:
        raise Reject(f"{op} with a dtype= cast is not fused")
    x, dim = args[0], _arg(args, kwargs, 1, "dim")
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise Reject(f"{op} over a computed dim is not fused")
    out = c.g.tensor(name)
    if out is None or c.g.tensor(x) is None or out[1] != c.g.tensor(x)[1]:
        raise Reject(f"{op} that changes the dtype (an integer or bool input) is not fused")
    shape, _ = c._float_tensor(x, "the scan input")
    if not shape or math.prod(shape) == 0:
        raise Reject(f"{op} of an empty or 0-d tensor")
    dim %= len(shape)
    a = Anchor("scan", op, x, out=name, replaces=[name], dim=dim)
    # reverse: the scan of x flipped on its dim, flipped back
    user = _single_user(c, name)
    if _flip_dim(c, x, len(shape)) == dim and len(c.g.users[x.name]) == 1 and user and \
            _flip_dim(c, NodeRef(user), len(shape)) == dim:
        a.params["reverse"] = True
        a.covers += [x.name, user]
        a.x, a.out, a.replaces = c.g.args(x.name)[0][0], user, [user]
        user = _single_user(c, user)
    # exclusive: the scan minus its own input
    s = _classified(c, user) if user and op == "cumsum" else None
    if isinstance(s, Pointwise) and s.binop == "sub" and s.inputs == [NodeRef(a.out), a.x]:
        a.params["exclusive"] = True
        a.covers.append(user)
        a.out, a.replaces = user, [user]
    shifted = _shifted(c, a.x, dim, shape) if op == "cumsum" and not a.params.get("exclusive") \
        and not a.params.get("reverse") else None
    if shifted:
        a.params["exclusive"] = True
        a.x, covered = shifted
        a.covers += covered
    prepended = _prepended(c, a.x, a.out, dim) if op == "cumsum" and not a.params.get("exclusive") \
        and not a.params.get("reverse") else None
    if prepended:   # the scan of x's first n - 1 elements, a zero in front: x's exclusive scan
        a.params["exclusive"] = True
        a.x, a.out, covered = prepended
        a.replaces = [a.out]
        a.covers += covered
        shape = c.g.tensor(a.x)[0]
    masked = _mask_of(c, a.x, shape)
    if masked:
        a.params["masked"] = True
        a.covers.append(a.x.name)
        a.x, mask = masked
        a.vectors = [mask]
    return a


def classify_module(c, name: str, target: str, info: dict, x) -> None:
    return None


def build(p, name: str, a: Anchor) -> None:
    """The scan group around anchor `a`: its mask, prologue and epilogue (a Partitioner's method
    in all but name)."""
    shape, dtype = p.g.tensor(a.x)
    d = a.dim
    dims = {"M": math.prod(shape) // shape[d], "N": shape[d]}
    params = dict(a.params)
    last = d == len(shape) - 1
    view = {"view": "rows", "contiguous": True} if last else {"view": "strided", "dim": d}
    if not last:
        params["inner"] = math.prod(shape[d + 1:])
    full = {"view": "like", "of": "main"}
    links = p._walk_back(a.x, shape, dtype, full, True) if last else []
    b = p.builder(NodeRef(links[0][1]) if links else a.x, dtype)
    b.inputs.append({"arg": 0, **view})
    for mask in a.vectors:   # the bool mask, laid out like x
        b.inputs.append({"arg": b.arg(mask), **view})
    prologue = []
    for node, running in links:
        prologue += p._step(node, running, b, shape, full, True)
        b.nodes += [node, *p.sem[node].covers]
    b.nodes += [name, *a.covers]
    epilogue, end = p._extend(a.out, b, shape, full, True) if last else ([], a.out)
    if prologue:
        params["prologue"] = prologue
    if epilogue:
        params["epilogue"] = epilogue
    p._finish("scan", a.op, dims, params, b, {"kind": "same"}, a.replaces if end == a.out else [end])
