"""torch.where, masked_fill and comparisons in a captured graph, as pointwise steps.

  * x.masked_fill(mask, v) (method, in-place twin on a fresh value, torch.masked_fill) and
    torch.where(mask, x, v) / torch.where(mask, v, x) / x.where(mask, v) with `mask` a bool tensor
    (an input, a buffer, or a comparison PyTorch computes) become "masked_fill" / "masked_keep"
    binops of x and the mask: a step that reads the mask as an operand (full size, or a
    broadcast one read in place), so they fuse into chains and epilogues (an attention
    score's masked_fill(-inf) before its softmax);
  * torch.where(f(x) CMP c, g(x), h(x)) where the condition compares a value against a number and
    every branch is a number or one-input steps of that same value (torch.where(x > 0, x, 0.2 * x))
    becomes one "select" step on x (`patterns`): no mask is written to memory.
torch.where of two tensor branches under a mask tensor stays PyTorch with the reason.
"""
from __future__ import annotations

import operator

import torch

from mtmc.kernels import pointwise
from mtmc.kernels.spec import DTYPES
from mtmc.module.fx_ops import NodeRef, Pointwise, Reject, _arg, q
from mtmc.module.pointwise_fusion import _path

WHERE = q(torch.where)
MASKED_FILL = q(torch.masked_fill)
# comparison targets -> CMP name (operator.gt for x > 0, torch.gt, x.gt(0) ...)
COMPARE_FUNCTIONS = {q(f): name for name, fs in {
    "gt": (operator.gt, torch.gt, torch.greater), "ge": (operator.ge, torch.ge, torch.greater_equal),
    "lt": (operator.lt, torch.lt, torch.less), "le": (operator.le, torch.le, torch.less_equal),
    "eq": (operator.eq, torch.eq), "ne": (operator.ne, torch.ne, torch.not_equal)}.items() for f in fs}
COMPARE_METHODS = {"gt": "gt", "ge": "ge", "lt": "lt", "le": "le", "eq": "eq", "ne": "ne", "greater": "gt",
                   "less": "lt", "greater_equal": "ge", "less_equal": "le", "not_equal": "ne"}


def _fill_value(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Reject("a fill value that is a tensor is not fused")
    return float(v)


def _mask(c, ref) -> NodeRef:
    t = c.g.tensor(ref) if isinstance(ref, NodeRef) else None
    if t is None or t[1] != "bool":
        raise Reject("the condition is not a bool tensor")
    return ref


def classify_call(c, name: str, fn, args, kwargs):
    n = c.g.by_name[name]
    method = n["target"] if n["op"] == "call_method" else None
    if fn == MASKED_FILL or method in ("masked_fill", "masked_fill_"):
        if method == "masked_fill_":
            c._check_inplace(args[0], name)
        x, mask, v = args[0], _arg(args, kwargs, 1, "mask"), _arg(args, kwargs, 2, "value")
        return Pointwise([x, _mask(c, mask)], binop="masked_fill", value=_fill_value(v))
    if fn == WHERE or method == "where":
        if method == "where":   # x.where(cond, y) is torch.where(cond, x, y)
            cond, a, b = args[1] if len(args) > 1 else kwargs.get("condition"), args[0], _arg(args, kwargs, 2, "other")
        else:
            cond, a, b = args[0], _arg(args, kwargs, 1, "input"), _arg(args, kwargs, 2, "other")
        if a is None or b is None:
            return None   # torch.where(cond) alone: the indices where it is set
        cond = _mask(c, cond)
        tensors = [isinstance(v, NodeRef) and c.g.tensor(v) is not None for v in (a, b)]
        if tensors == [True, False]:
            return Pointwise([a, cond], binop="masked_keep", value=_fill_value(b))
        if tensors == [False, True]:
            return Pointwise([b, cond], binop="masked_fill", value=_fill_value(a))
        if tensors == [False, False]:
            raise Reject("torch.where of two numbers makes a tensor from the mask alone; it stays PyTorch")
        raise Reject("torch.where of two tensors under a mask tensor is not fused (a comparison of one "
                     "value with a number is)")
    return None


def classify_module(c, name, target, info, x):
    return None


def _comparison(p, ref) -> tuple[NodeRef, str, float] | None:
    """(the compared value, CMP name, the number) when `ref` is value CMP number (either side)."""
    if not isinstance(ref, NodeRef):
        return None
    n = p.g.by_name[ref.name]
    cmp = COMPARE_FUNCTIONS.get(n["target"]) if n["op"] == "call_function" else \
        COMPARE_METHODS.get(n["target"]) if n["op"] == "call_method" else None
    if cmp is None:
        return None
    args, kwargs = p.g.args(ref.name)
    a, b = args[0], _arg(args, kwargs, 1, "other")
    for value, num, op in ((a, b, cmp), (b, a, pointwise.CMP_FLIPPED[cmp])):
        if isinstance(value, NodeRef) and isinstance(num, (int, float)) and not isinstance(num, bool):
            return value, op, float(num)
    return None


def _where_args(p, name: str):
    n = p.g.by_name[name]
    args, kwargs = p.g.args(name)
    if n["op"] == "call_function" and n["target"] == WHERE and len(args) + len(kwargs) == 3:
        return args[0], _arg(args, kwargs, 1, "input"), _arg(args, kwargs, 2, "other")
    if n["op"] == "call_method" and n["target"] == "where" and len(args) == 3:
        return args[1], args[0], args[2]
    return None


def patterns(p) -> None:
    """Each torch.where(f(x) CMP c, g(x), h(x)) as one select step on x (see the module doc)."""
    for n in p.g.nodes:
        m = n["name"]
        found = _where_args(p, m) if n["op"] in ("call_function", "call_method") else None
        out = p.g.tensor(m)
        if found is None or out is None or out[1] not in DTYPES or m in p.taken:
            continue
        cond, a, b = found
        compared = _comparison(p, cond)
        if compared is None or p.g.users[cond.name] != [m]:
            continue
        value, cmp, num = compared
        if p.g.tensor(value) != out:
            continue
        roots, sides, covers = set(), {}, [cond.name]
        for side, ref, consumer in (("cond", value, cond.name), ("then", a, m), ("else", b, m)):
            if isinstance(ref, NodeRef):
                if p.g.tensor(ref) != out:
                    break
                root, steps, nodes = _path(p, ref, consumer, out)
                roots.add(root)
                sides[side] = steps
                covers += nodes
            elif isinstance(ref, (int, float)) and not isinstance(ref, bool) and side != "cond":
                sides[side] = float(ref)
            else:
                break
        else:
            if len(roots) != 1 or any(pointwise.uses_index(s) for s in sides.values() if isinstance(s, list)):
                continue
            root = roots.pop()
            covers = list(dict.fromkeys(covers))
            step = {"op": "select", "cond": sides["cond"], "cmp": cmp, "value": num,
                    "then": sides["then"], "else": sides["else"]}
            p.sem[m] = Pointwise([NodeRef(root)], [step], covers=covers)
            p.why.pop(m, None)
            for c in covers:
                p.sem.pop(c, None)
                p.why[c] = f"computed inside the fused torch.where at {p.g.words(m)}"
            users = p.g.users[root]
            users[:] = [u for u in users if u not in covers and u != m] + [m]


def build(p, name, anchor) -> None:   # no anchors of its own
    raise AssertionError("where_fusion builds no groups")
