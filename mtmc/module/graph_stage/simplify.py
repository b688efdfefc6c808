"""Identities removed from the graph (exact for finite values), each refused where not legal.

  softmax / log_softmax over a dim of size 1   -> ones / zeros of the input's shape and dtype
  logsumexp / sum / mean / amax / amin / prod over dims of size 1, and the values of max / min
  over a dim of size 1                         -> the input (squeezed when keepdim is False)
  x * 1, x / 1, x + 0, x - 0                   -> x
  x - x                                        -> zeros of its shape and dtype
  x.transpose(a, b).transpose(a, b), permutes that compose to the identity -> x
  a reshape / view to the shape it already has -> x

module.identities reads past copies (clone, detach, eval dropout) before fusion; these change
what is computed, so they live here, as recorded rewrites.  Refused: where the value or its
input is changed in place later (the op is then a real copy), where removing the op would make a
graph output the same tensor as an input or a parameter (the caller could see one change with the
other), and where the dtype or shape would change.  A softmax of a row holding inf or nan gives
nan, the constant does not (nor does inf - inf): the rewrites assume finite values (the guard
checks finite inputs).  A constant is made from the shape alone (`new_ones` on a graph input, for
its device; ModelNew then runs Model's forward on inputs of other shapes), so whatever only fed
the replaced op is dropped with it: pure functions and module
calls, but never an in-place op nor a module updating its buffers (a norm with running statistics
in training mode); a dropout so dropped no longer draws its random numbers, so none is dropped
while another random op stays (its draws would change).
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from mtmc.module.functionalize import mutations
from mtmc.module.fx_ops import Graph, NodeRef, Pointwise, _arg, q
from mtmc.module.graph_stage.common import MATMULS, classify
from mtmc.module.graph_stage.edit import Editor, draws_random, numel, readers, stateless_module_calls
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
VALUES_OF = {q(torch.max): "max", q(torch.min): "min"}   # (values, indices) with a dim
GEMMS = MATMULS | {q(torch.bmm), q(F.linear)}   # for the work a dropped node did


def _mutated(g: Graph) -> set[str]:
    """Values an in-place op changes (views of them included)."""
    return {value for _, value in mutations(g)}


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
        constant = make in ("ones", "zeros")
        ed, dropped = _edit(g, desc, name, make, src, t, from_shape=constant)
        if constant and shifts_random_draws(g, ed.desc, dropped):
            ed, dropped = _edit(g, desc, name, make, src, t, from_shape=False)
        size = 4.0 * numel(t[0])
        after = Work(0.0, size if constant else 0.0, 1 if constant else 0)
        before = Work(float(numel(t[0])), 2 * size, 1) + work_of(g, [d for d in dropped if d != name])
        result = {"alias": "its input", "ones": "ones of its shape", "zeros": "zeros of its shape"}.get(
            make if isinstance(make, str) else "", "its input with the size-1 dims squeezed")
        gone = [g.words(d) for d in dropped if d != name and g.by_name[d]["op"] != "get_attr"
                and g.by_name[d]["target"] not in ("getattr", q(operator.getitem))]
        if gone and constant:
            result += f"; what only fed it is no longer computed: {', '.join(gone)}"
        found.append(Candidate(RULE, name, g.path, True, f"exact: {kind}", ops=ops, result=result,
                               before=before, after=after, dtype=t[1], apply=ed.desc))
    return found


def _edit(g: Graph, desc: dict, name: str, make, src: str, t, from_shape: bool) -> tuple[Editor, list[str]]:
    """The graph with node `name` replaced as `make` says, and the nodes dropped as dead.  A
    constant made from the shape alone leaves the work that fed the op unread: it goes too
    (module calls included, but never one that updates buffers, nor an in-place op)."""
    ed = Editor(desc)
    had = readers(desc)
    if make == "alias":
        new = NodeRef(src)
    elif make in ("ones", "zeros"):
        new = _constant(g, ed, name, make, src, t, from_shape)
    else:   # ("squeeze", dims)
        new = ed.add(name, "squeeze", "call_method", "squeeze", (NodeRef(src), tuple(make[1])), {}, t[0], t[1])
    ed.replace_uses(name, new)
    return ed, ed.drop_dead(had | {name}, {name} | (stateless_module_calls(desc) if from_shape else set()))


def shifts_random_draws(g: Graph, after: dict, dropped: list[str]) -> bool:
    """Dropping a random op (a training-mode dropout) of graph `g` while another stays would
    change the numbers the one that stays draws (the generator's stream moves by less)."""
    return any(draws_random(g.modules, g.by_name[d]) for d in dropped) and \
        any(draws_random(g.modules, n) for n in after["nodes"])


def _constant(g: Graph, ed: Editor, name: str, make: str, src: str, t, from_shape: bool = True) -> NodeRef:
    """ones / zeros of the op's shape and dtype, on the device of a graph input (so nothing
    computed is read: the work before it can go), or like `src` when the graph has no tensor
    input or `from_shape` is off."""
    first = next((n["name"] for n in g.nodes if n["op"] == "placeholder" and g.tensor(n["name"]) is not None), None)
    if first is None or not from_shape:
        fn = q(torch.ones_like) if make == "ones" else q(torch.zeros_like)
        return ed.add(name, make, "call_function", fn, (NodeRef(src),), {}, t[0], t[1])
    # its shape is the recorded call's: ModelNew runs Model's own forward on inputs of other shapes
    # (assemble.shape_guard), where the constant's shape could differ
    ed.desc["shapes_fixed"] = True
    return ed.add(name, make, "call_method", f"new_{make}", (NodeRef(first), tuple(t[0])),
                  {"dtype": getattr(torch, t[1])}, t[0], t[1])


def work_of(g: Graph, names: list[str]) -> Work:
    """Rough work of captured nodes (for the predicted gain of dropping them): a GEMM's or
    conv's multiply-adds, else one flop per output element; bytes read and written."""
    total = Work()
    for name in names:
        t = g.tensor(name)
        if t is None:
            continue
        out = numel(t[0])
        args, _ = g.args(name)
        ins = [g.tensor(a) for a in args if isinstance(a, NodeRef) and g.tensor(a) is not None]
        flops = float(out)
        n = g.by_name[name]
        if n["op"] == "call_module":
            info = g.modules.get(n["target"], {})
            w = info.get("params", {}).get("weight")
            if w and ("Linear" in info.get("type", "") or "Conv" in info.get("type", "")):
                flops = 2.0 * out * numel(w["shape"][1:])
        elif n["target"] in GEMMS and ins:
            flops = 2.0 * out * ins[0][0][-1]
        total = total + Work(flops, 4.0 * (out + sum(numel(s) for s, _ in ins)), 1)
    return total


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
    # the values of torch.max / torch.min over a dim of size 1 (x.max(1)[0], .values)
    if (fn == q(operator.getitem) and args[1:2] == (0,)) or (fn == "getattr" and args[1:2] == ("values",)):
        src = args[0] if isinstance(args[0], NodeRef) else None
        s = g.by_name[src.name] if src else None
        op = s and (VALUES_OF.get(s["target"]) if s["op"] == "call_function" else
                    s["target"] if s["op"] == "call_method" and s["target"] in ("max", "min") else None)
        if op:
            sargs, skwargs = g.args(src.name)
            if _arg(sargs, skwargs, 1, "dim") is not None:
                return _singleton_reduction(g, name, op, sargs, skwargs)
        return None
    # x * 1, x / 1, x + 0, x - 0; and x - x
    s = classify(g, name)
    if isinstance(s, Pointwise) and s.binop in ("mul", "div", "add", "sub"):
        x, y = s.inputs
        if s.binop == "sub" and isinstance(x, NodeRef) and x == y and g.tensor(x) == t:
            return ("x - x is 0 (for finite x)", x.name, "zeros")
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

