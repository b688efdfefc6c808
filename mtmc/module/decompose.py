"""Composite torch ops written as the plain ops the catalog fuses, in a traced fx graph.

`torch.baddbmm(b, q, k, alpha=a)` is a bmm, a scale and an add; `F.glu(x)` is a chunk, a
sigmoid and a product; nn.PReLU is F.prelu of its weight; a clamp between tensors is a maximum
and a minimum; `torch.addcmul(x, a, b, value=v)` is a product, a scale and an add.
Left whole they stay PyTorch ("outside the kernel catalog"); written out, the matmul families
take the scale and the add as their epilogue and the elementwise family one kernel for the rest.
Each rewrite computes what PyTorch's own kernel computes, in the same order where the order
changes the rounding (lerp's two forms), so the result is Model's to the last bit or to one
rounding.  Only forms whose arguments are known at trace time (numbers, not tensors, for the
scales) are rewritten; the rest are left as they are.
"""
from __future__ import annotations

import operator

import torch
import torch.nn as nn
import torch.nn.functional as F


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _arg(node, i: int, name: str, default=None):
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[i] if len(node.args) > i else default


class _Writer:
    """New nodes before `node`, each carrying its source line (for the reports)."""

    def __init__(self, graph, node):
        self.graph, self.node = graph, node

    def fn(self, target, *args, **kwargs):
        with self.graph.inserting_before(self.node):
            made = self.graph.call_function(target, args, kwargs)
        made.stack_trace = self.node.stack_trace
        return made

    def attr(self, path: str):
        with self.graph.inserting_before(self.node):
            made = self.graph.get_attr(path)
        made.stack_trace = self.node.stack_trace
        return made

    def method(self, name, *args, **kwargs):
        with self.graph.inserting_before(self.node):
            made = self.graph.call_method(name, args, kwargs)
        made.stack_trace = self.node.stack_trace
        return made


def _matmul_plus(w: _Writer, product, added, beta, alpha):
    """beta * added + alpha * product, as PyTorch's addmm / baddbmm define it (beta 0 ignores
    `added`, NaNs included)."""
    out = product if alpha == 1 else w.fn(operator.mul, product, alpha)
    if beta == 0:
        return out
    return w.fn(operator.add, out, added if beta == 1 else w.fn(operator.mul, added, beta))


def _glu(w: _Writer, x, dim):
    halves = w.method("chunk", x, 2, dim)
    a, b = w.fn(operator.getitem, halves, 0), w.fn(operator.getitem, halves, 1)
    return w.fn(operator.mul, a, w.fn(torch.sigmoid, b))


def _lerp(w: _Writer, start, end, weight):
    """ATen's lerp: start + weight * (end - start) below weight 0.5, end - (end - start) * (1 - weight)
    from it on (exact at both ends)."""
    diff = w.fn(operator.sub, end, start)
    if weight < 0.5:
        return w.fn(operator.add, start, w.fn(operator.mul, diff, weight))
    return w.fn(operator.sub, end, w.fn(operator.mul, diff, 1.0 - weight))


def _rewrite(graph, node, mod):
    """The node that replaces `node`, or None to leave it."""
    w = _Writer(graph, node)
    target, method = node.target, node.target if node.op == "call_method" else None
    if node.op == "call_module":
        sub = mod.get_submodule(node.target)
        if type(sub) is nn.GLU and node.args:
            return _glu(w, node.args[0], sub.dim)
        if type(sub) is nn.PReLU and node.args:   # its weight read where the kernel needs it
            return w.fn(F.prelu, node.args[0], w.attr(f"{node.target}.weight"))
        return None
    if target is F.glu or method == "glu":
        return _glu(w, node.args[0], _arg(node, 1, "dim", -1))
    if target in (torch.baddbmm, torch.addmm) or method in ("baddbmm", "addmm"):
        beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
        batched = target is torch.baddbmm or method == "baddbmm"
        if not (_number(beta) and _number(alpha)) or (not batched and beta == 1 and alpha == 1):
            return None   # addmm(v, a, b) as it is: the matmul with its bias (fx_ops._addmm)
        added, a, b = node.args[0], _arg(node, 1, "batch1" if batched else "mat1"), \
            _arg(node, 2, "batch2" if batched else "mat2")
        if a is None or b is None:
            return None
        return _matmul_plus(w, w.fn(torch.bmm if batched else torch.mm, a, b), added, beta, alpha)
    if target in (torch.addcmul, torch.addcdiv) or method in ("addcmul", "addcdiv"):
        value = node.kwargs.get("value", 1)
        t1, t2 = _arg(node, 1, "tensor1"), _arg(node, 2, "tensor2")
        if not _number(value) or t1 is None or t2 is None:
            return None
        mul = target is torch.addcmul or method == "addcmul"
        if mul:   # ATen: input + value * tensor1 * tensor2
            scaled = t1 if value == 1 else w.fn(operator.mul, t1, value)
            return w.fn(operator.add, node.args[0], w.fn(operator.mul, scaled, t2))
        quotient = w.fn(operator.truediv, t1, t2)   # ATen: input + value * (tensor1 / tensor2)
        return w.fn(operator.add, node.args[0], quotient if value == 1 else w.fn(operator.mul, quotient, value))
    if target in (torch.clamp, torch.clip) or method in ("clamp", "clip"):
        lo, hi = _arg(node, 1, "min"), _arg(node, 2, "max")
        if not any(isinstance(v, torch.fx.Node) for v in (lo, hi)):
            return None   # number bounds: a clamp step as it is
        # tensor bounds: max then min, as PyTorch's clamp (a NaN in x stays NaN)
        out = node.args[0]
        if lo is not None:
            out = w.fn(torch.maximum, out, lo) if isinstance(lo, torch.fx.Node) else w.fn(torch.clamp, out, min=lo)
        if hi is not None:
            out = w.fn(torch.minimum, out, hi) if isinstance(hi, torch.fx.Node) else w.fn(torch.clamp, out, max=hi)
        return out
    if target is torch.lerp or method == "lerp":
        weight = _arg(node, 2, "weight")
        if not _number(weight):
            return None
        return _lerp(w, node.args[0], _arg(node, 1, "end"), float(weight))
    return None


def decompose(graph, mod) -> list[str]:
    """Write each composite op of `graph` (in place) as its plain ops; the names rewritten."""
    done = []
    for node in list(graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module") or node.kwargs.get("out") is not None:
            continue
        made = _rewrite(graph, node, mod)
        if made is None:
            continue
        node.replace_all_uses_with(made)
        graph.erase_node(node)
        done.append(node.name)
    return done
