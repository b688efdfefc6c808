"""More spellings of a matrix product in a captured graph (a fusion plugin like conv_fusion).

  * torch.tensordot(a, b, dims) contracting a's last dim with one dim of a 2-D b: a matmul
    (b read as [K, N], or as [N, K] through its strides);
  * torch.diag(v) @ B: a row scaling, v[:, None] * B, as an elementwise kernel reading v in
    place (no [N, N] matrix is made, no N^2 K products are done); B @ torch.diag(v): a column
    scaling, B * v;
  * A @ v, torch.mv(A, v) (a matrix-vector product, memory-bound): a row reduction sum(A * v)
    over A's last dim, one pass over A with v read in place and fp32 sums.
einsum's matmul forms are module.fx_ops' (einsum_b_layout).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from mtmc.kernels.spec import DTYPES
from mtmc.module.fx_ops import MATMUL_FUNCTIONS, Anchor, NodeRef, Pointwise, Reject, _arg, q

TENSORDOT, DIAG = q(torch.tensordot), q(torch.diag)
RESHAPES = {q(torch.reshape), q(torch.flatten)}
RESHAPE_METHODS = ("view", "reshape", "flatten", "unflatten")
MATVEC_FUNCTIONS = MATMUL_FUNCTIONS | {q(torch.mv)}


def classify_call(c, name: str, fn: str | None, args: tuple, kwargs: dict) -> Anchor | None:
    """A matmul anchor for a tensordot that is a matmul, None for any other function."""
    if fn != TENSORDOT:
        return None
    a, b, dims = _arg(args, kwargs, 0, "a"), _arg(args, kwargs, 1, "b"), _arg(args, kwargs, 2, "dims", 2)
    (sa, _), (sb, _) = c._float_tensor(a, "tensordot's a"), c._float_tensor(b, "tensordot's b")
    if isinstance(dims, int) and not isinstance(dims, bool):
        if dims != 1:
            raise Reject(f"tensordot over {dims} dims is not fused (one contracted dim is a matmul)")
        da, db = len(sa) - 1, 0
    elif isinstance(dims, (list, tuple)) and len(dims) == 2:
        da, db = ([d] if isinstance(d, int) else list(d) for d in dims)
        if len(da) != 1 or len(db) != 1 or not all(isinstance(d, int) for d in (*da, *db)):
            raise Reject("tensordot over several dims is not fused")
        da, db = da[0] % len(sa), db[0] % len(sb)
    else:
        raise Reject("tensordot with computed dims is not fused")
    if len(sb) != 2 or da != len(sa) - 1:
        raise Reject("tensordot that contracts a dim other than a's last, or with a b that is not a matrix, "
                     "is not fused")
    return c._matmul(name, a, b, b_nk=db == 1)


def classify_module(c, name: str, target: str, info: dict, x) -> None:
    return None


def _diag_of(p, ref) -> NodeRef | None:
    """v when `ref` is torch.diag(v) of a vector v, read by one node only."""
    if not isinstance(ref, NodeRef):
        return None
    n = p.g.by_name[ref.name]
    if not (n["op"] == "call_function" and n["target"] == DIAG) or len(p.g.users[ref.name]) != 1:
        return None
    args, kwargs = p.g.args(ref.name)
    v = args[0] if args else None
    t = p.g.tensor(v) if isinstance(v, NodeRef) else None
    if t is None or len(t[0]) != 1 or _arg(args, kwargs, 1, "diagonal", 0) != 0:
        return None
    return v


def _matvec(p, name: str) -> Anchor | None:
    """A matrix-vector product A @ v (A with >= 2 dims, v 1-D) as a "matvec" anchor."""
    n = p.g.by_name[name]
    if not ((n["op"] == "call_function" and n["target"] in MATVEC_FUNCTIONS)
            or (n["op"] == "call_method" and n["target"] in ("matmul", "mv"))):
        return None
    args, kwargs = p.g.args(name)
    a, v = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "other", kwargs.get("vec"))
    ta, tv = (p.g.tensor(r) if isinstance(r, NodeRef) else None for r in (a, v))
    if ta is None or tv is None or len(ta[0]) < 2 or len(tv[0]) != 1 or ta[1] != tv[1] or ta[1] not in DTYPES:
        return None
    return Anchor("matmul_form", "matvec", a, vectors=[v], out=name, replaces=[name])


def _reshape_of(p, name: str) -> NodeRef | None:
    """The tensor a view / reshape / flatten node `name` reads, or None for any other node."""
    n = p.g.by_name[name]
    if not ((n["op"] == "call_method" and n["target"] in RESHAPE_METHODS)
            or (n["op"] == "call_function" and n["target"] in RESHAPES)):
        return None
    args, _ = p.g.args(name)
    return args[0] if args and isinstance(args[0], NodeRef) and p.g.tensor(args[0]) else None


def _unflattened(p, name: str, a: Anchor) -> tuple[str, Anchor] | None:
    """x.view(-1, K) @ w (or addmm) viewed back to [*lead, N] (GPT-2's Conv1D): the matmul of x
    itself, its result the second view, so the pointwise ops after that view join its epilogue."""
    if not (a.family == "matmul" and a.op == "matmul" and isinstance(a.x, NodeRef)) or len(p.g.users[name]) != 1:
        return None
    x, (after,) = _reshape_of(p, a.x.name), p.g.users[name]
    if x is None or p.g.users[a.x.name] != [name] or _reshape_of(p, after) != NodeRef(name):
        return None
    (sx, _), (sm, _), (sv, _) = p.g.tensor(x), p.g.tensor(name), p.g.tensor(after)
    if len(sx) < 3 or p.g.tensor(a.x)[0] != [math.prod(sx[:-1]), sx[-1]] or sv != [*sx[:-1], sm[-1]]:
        return None
    return after, dataclasses.replace(a, x=x, out=after, replaces=[after], covers=[*a.covers, name, a.x.name])


def patterns(p) -> None:
    """diag(v) @ B -> a row-scaling anchor; B @ diag(v) -> B * v; A @ v -> a matvec anchor;
    x.view(-1, K) @ w viewed back -> the matmul of x."""
    for n in p.g.nodes:
        found = _matvec(p, n["name"]) if n["name"] not in p.sem else None
        if found:
            p.sem[n["name"]] = found
            p.why.pop(n["name"], None)
    for name, a in list(p.sem.items()):
        found = _unflattened(p, name, a) if isinstance(a, Anchor) else None
        if found:
            p.sem.pop(name)
            p.sem[found[0]] = found[1]
            p.why.pop(found[0], None)
    for name, a in list(p.sem.items()):
        if not (isinstance(a, Anchor) and a.family == "matmul" and a.op == "matmul" and a.bias is None):
            continue
        v = _diag_of(p, a.x)
        if v is not None and not a.b_nk and isinstance(a.b, NodeRef) and len(p.g.tensor(a.b)[0]) == 2:
            p.sem[name] = Anchor("matmul_form", "rowscale", a.b, vectors=[v], covers=[a.x.name], out=name,
                                 replaces=[name])
        elif (w := _diag_of(p, a.b)) is not None and not a.b_nk and len(p.g.tensor(a.x)[0]) == 2:
            p.sem[name] = Pointwise([a.x, w], binop="mul", covers=[a.b.name])
        else:
            continue
        p.sem.pop((a.x if v is not None else a.b).name, None)


def build(p, name: str, a: Anchor, builder=None) -> None:
    """The group of a "matmul_form" anchor (a Partitioner's method in all but name; `builder` its
    group builder class, or None where the partitioner makes builders, p.builder)."""
    (_matvec_group if a.op == "matvec" else _rowscale_group)(p, name, a, builder)


def _matvec_group(p, name: str, a: Anchor, builder) -> None:
    """A @ v as sum(A * v) over A's last dim: a reduction whose prologue multiplies by v, read
    in place as a periodic operand (element i of a row meets v[i % K])."""
    shape, dtype = p.g.tensor(a.x)
    k = shape[-1]
    if p.g.tensor(a.vectors[0]) != ([k], dtype):
        p.why[name] = f"the vector is not a [{k}] {dtype} vector"
        return
    b = builder(p.g, a.x, dtype) if builder else p.builder(a.x, dtype)
    b.inputs += [{"arg": 0, "view": "rows", "contiguous": True}, {"arg": b.arg(a.vectors[0]), "view": "periodic"}]
    b.nodes.append(name)
    p._finish("reduction", "sum", {"M": math.prod(shape[:-1]), "N": k}, {"prologue": [{"op": "mul", "every": 1, "period": k}]}, b,
              {"kind": "reduced", "dim": len(shape) - 1, "keepdim": False}, [name])


def _rowscale_group(p, name: str, a: Anchor, builder) -> None:
    """diag(v) @ B as out = B * v[row]: an elementwise chain whose operand v is read in place
    (a periodic operand: element i of B meets v[i // N]), with the pointwise tail after it."""
    shape, dtype = p.g.tensor(a.x)
    v = a.vectors[0]
    if p.g.tensor(v) != ([shape[0]], dtype):
        p.why[name] = f"diag's vector is not a [{shape[0]}] {dtype} vector"
        return
    b = builder(p.g, a.x, dtype) if builder else p.builder(a.x, dtype)
    b.inputs += [{"arg": 0, "view": "rows"}, {"arg": b.arg(v), "view": "periodic"}]
    b.nodes += [name, *a.covers]
    more, last = p._extend(name, b, shape, {"view": "like", "of": "main"}, vector_ok=True)
    chain = [{"op": "mul", "every": shape[1], "period": shape[0]}, *more]
    p._finish("elementwise", "chain", {"M": shape[0], "N": shape[1]}, {"chain": chain}, b, {"kind": "same"}, [last])
