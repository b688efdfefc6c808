"""Identities removed from the graph (exact for finite values), each refused where not legal.

  softmax / log_softmax over a dim of size 1   -> ones / zeros of the input's shape and dtype
  logsumexp / sum / mean / amax / amin / prod over dims of size 1 -> the input (squeezed when
                                                  keepdim is False)
  x * 1, x / 1, x + 0, x - 0                   -> x
  x.transpose(a, b).transpose(a, b), permutes that compose to the identity -> x
  a reshape / view to the shape it already has -> x

module.identities reads past copies (clone, detach, eval dropout) before fusion; these change
what is computed, so they live here, as recorded rewrites.  Refused: where the value or its
input is changed in place later (the op is then a real copy), where removing the op would make a
graph output the same tensor as an input or a parameter (the caller could see one change with the
other), and where the dtype or shape would change.  A softmax of a row holding inf or nan gives
nan, the constant does not: the rewrite assumes finite inputs (the guard checks finite ones).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mtmc.module.fx_ops import Graph, NodeRef, Pointwise, _arg, q
from mtmc.module.graph_stage.common import classify
from mtmc.module.graph_stage.edit import Editor, numel, readers
from mtmc.module.graph_stage.records import Candidate, Work

RULE = "identity"
SOFTMAX = {q(F.softmax): "softmax", q(torch.softmax): "softmax", q(F.log_softmax): "log_softmax",
           q(torch.log_softmax): "log_softmax"}
SOFTMAX_MODULES = {"torch.nn.modules.activation.Softmax": "softmax", "torch.nn.modules.activation.LogSoftmax":
                   "log_softmax"}
REDUCE = {q(torch.logsumexp): "logsumexp", q(torch.sum): "sum", q(torch.mean): "mean", q(torch.amax): "amax",
          q(torch.amin): "amin", q(torch.prod): "prod"}
REDUCE_METHODS = {"logsumexp", "sum", "mean", "amax", "amin", "prod"}
TRANSPOSE, PERMUTE = q(torch.transpose), q(torch.permute)
RESHAPES = {"reshape", "view"}


def _mutated(g: Graph) -> set[str]:
    """Values an in-place op changes."""
    out = set()
    for n in g.nodes:
        if not n["op"].startswith("call_"):
            continue
        args, kwargs = g.args(n["name"])
        t = n["target"].rsplit(".", 1)[-1]
        inplace = (n["op"] != "call_module" and t.endswith("_") and not t.startswith("_")) or kwargs.get("inplace") is True \
            or (n["op"] == "call_module" and g.modules.get(n["target"], {}).get("attrs", {}).get("inplace"))
        if inplace and args and isinstance(args[0], NodeRef):
            out.add(args[0].name)
    return out


def _outputs(g: Graph) -> set[str]:
    out = g.by_name.get("output")
    if out is None:
        return set()
    from mtmc.module.fxjson import arg_nodes
    return set(arg_nodes(out["args"]))


def _io(g: Graph, name: str) -> bool:
    return g.by_name[name]["op"] in ("placeholder", "get_attr")


def candidates(desc: dict) -> list[Candidate]:
    g = Graph(desc)
    mutated, outputs = _mutated(g), _outputs(g)
    found = []
    for n in g.nodes:
        name = n["name"]
        if not n["op"].startswith("call_") or g.tensor(name) is None:
            continue
        hit = _match(g, name)
        if hit is None:
            continue
        kind, src, make = hit
        t = g.tensor(name)
        ops = [g.words(name)]
        refuse = lambda why: Candidate(RULE, name, g.path, False, why, ops=ops, result=kind)  # noqa: E731
        if src in mutated or name in mutated:
            found.append(refuse(f"{g.words(name)}: its value or its input is changed in place later, so it is "
                                "a real copy"))
            continue
        if make == "alias" and name in outputs and _io(g, src):
            found.append(refuse(f"{g.words(name)} is a graph output: without it the output would be the "
                                f"{'input' if g.by_name[src]['op'] == 'placeholder' else 'parameter'} itself (aliased)"))
            continue
        ed = Editor(desc)
        had = readers(desc)
        if make == "alias":
            new = NodeRef(src)
        elif make in ("ones", "zeros"):
            fn = q(torch.ones_like) if make == "ones" else q(torch.zeros_like)
            new = ed.add(name, make, "call_function", fn, (NodeRef(src),), {}, t[0], t[1])
        else:   # ("squeeze", dims)
            new = ed.add(name, "squeeze", "call_method", "squeeze", (NodeRef(src), tuple(make[1])), {}, t[0], t[1])
        ed.replace_uses(name, new)
        ed.drop_dead(had | {name}, {name})
        size = 4.0 * numel(t[0])
        after = Work(0.0, size if make in ("ones", "zeros") else 0.0, 1 if make in ("ones", "zeros") else 0)
        result = {"alias": "its input", "ones": "ones of its shape", "zeros": "zeros of its shape"}.get(
            make if isinstance(make, str) else "", "its input with the size-1 dims squeezed")
        found.append(Candidate(RULE, name, g.path, True, f"exact: {kind}", ops=ops, result=result,
                               before=Work(float(numel(t[0])), 2 * size, 1), after=after, dtype=t[1],
                               apply=ed.desc))
    return found


def _singleton_reduction(g: Graph, name: str, op: str, args, kwargs):
    x = args[0] if args else None
    if not isinstance(x, NodeRef) or g.tensor(x) is None:
        return None
    shape, dtype = g.tensor(x)
    dim = _arg(args, kwargs, 1, "dim")
    keepdim = _arg(args, kwargs, 2, "keepdim", False)
    if dim is None or kwargs.get("dtype") is not None or not isinstance(keepdim, bool):
        return None
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims) or not shape:
        return None
    dims = sorted({d % len(shape) for d in dims})
    if any(shape[d] != 1 for d in dims) or g.tensor(name)[1] != dtype:
        return None
    what = f"{op} over dim{'s' if len(dims) > 1 else ''} {dims} of size 1 is its input"
    return (what, x.name, "alias" if keepdim else ("squeeze", dims))


def _match(g: Graph, name: str):
    """(what it is in words, the node whose value it repeats, how to make it) or None."""
    n = g.by_name[name]
    args, kwargs = g.args(name)
    t = g.tensor(name)
    fn = n["target"] if n["op"] == "call_function" else None
    method = n["target"] if n["op"] == "call_method" else None
    # softmax over a dim of size 1
    op = SOFTMAX.get(fn) or (method if method in ("softmax", "log_softmax") else None)
    dim = _arg(args, kwargs, 1, "dim") if op else None
    if n["op"] == "call_module":
        info = g.modules.get(n["target"], {})
        op = SOFTMAX_MODULES.get(info.get("type", ""))
        dim = info.get("attrs", {}).get("dim")
    if op:
        x = args[0] if args else None
        if isinstance(x, NodeRef) and g.tensor(x) and isinstance(dim, int) and g.tensor(x) == t \
                and kwargs.get("dtype") is None and g.tensor(x)[0][dim] == 1:
            return (f"{op} over a dim of size 1 is {'1' if op == 'softmax' else '0'} everywhere",
                    x.name, "ones" if op == "softmax" else "zeros")
        return None
    op = REDUCE.get(fn) or (method if method in REDUCE_METHODS else None)
    if op:
        return _singleton_reduction(g, name, op, args, kwargs)
    # x * 1, x / 1, x + 0, x - 0
    s = classify(g, name)
    if isinstance(s, Pointwise) and s.binop in ("mul", "div", "add", "sub"):
        x, y = s.inputs
        unit = {"mul": 1.0, "div": 1.0, "add": 0.0, "sub": 0.0}[s.binop]
        for a, b, ok in ((x, y, True), (y, x, s.binop in ("mul", "add"))):
            if ok and isinstance(a, NodeRef) and g.number(b) == unit and not isinstance(b, NodeRef) \
                    and g.tensor(a) == t:
                sym = {"mul": "*", "div": "/", "add": "+", "sub": "-"}[s.binop]
                return (f"x {sym} {unit:g} is x", a.name, "alias")
        return None
    # transposes and permutes that cancel
    if fn == TRANSPOSE or method == "transpose":
        x = args[0] if args else None
        if isinstance(x, NodeRef) and len(args) >= 3:
            inner = g.by_name[x.name]
            if (inner["op"] == "call_method" and inner["target"] == "transpose") or \
                    (inner["op"] == "call_function" and inner["target"] == TRANSPOSE):
                iargs, _ = g.args(x.name)
                nd = len(t[0])
                if len(iargs) >= 3 and isinstance(iargs[0], NodeRef) and all(isinstance(d, int) for d in (*args[1:3], *iargs[1:3])) \
                        and {d % nd for d in args[1:3]} == {d % nd for d in iargs[1:3]} \
                        and len(g.users[x.name]) == 1 and g.tensor(iargs[0]) == t:
                    return ("two transposes of the same dims cancel", iargs[0].name, "alias")
        return None
    if fn == PERMUTE or method == "permute":
        x = args[0] if args else None
        perm = _perm(args)
        if isinstance(x, NodeRef) and perm is not None:
            inner = g.by_name[x.name]
            if (inner["op"] == "call_method" and inner["target"] == "permute") or \
                    (inner["op"] == "call_function" and inner["target"] == PERMUTE):
                iargs, _ = g.args(x.name)
                ip = _perm(iargs)
                nd = len(t[0])
                if ip is not None and isinstance(iargs[0], NodeRef) and len(ip) == len(perm) == nd \
                        and [ip[p % nd] % nd for p in perm] == list(range(nd)) and len(g.users[x.name]) == 1 \
                        and g.tensor(iargs[0]) == t:
                    return ("two permutes that compose to the identity cancel", iargs[0].name, "alias")
        return None
    if method in RESHAPES or fn == q(torch.reshape):
        x = args[0] if args else None
        if isinstance(x, NodeRef) and g.tensor(x) == t:
            return (f"a {method or 'reshape'} to the shape it already has ({t[0]}) is its input", x.name, "alias")
    return None


def _perm(args) -> list[int] | None:
    rest = list(args[1:])
    if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
        rest = list(rest[0])
    return rest if rest and all(isinstance(d, int) and not isinstance(d, bool) for d in rest) else None

