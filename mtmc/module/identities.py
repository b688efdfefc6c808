"""Ops that return their input's value unchanged, removed from a captured graph before fusion.

x.clone(), x.detach(), x.contiguous(), dropout in eval mode or with p=0, nn.Identity, x.float()
on an fp32 tensor, x.to(the same dtype): each is a copy or a view at most, and as a node of its
own it would split a fusion group (`orig = x.clone().detach()` ... `y + orig` kept the residual
add out of the epilogue).  `without_identities` gives the partitioner a view of the graph where
every reader of such a node reads the node's input instead; the identity nodes are left with no
readers, so the assembled forward drops them with the nodes they fed (module.assemble).

Not removed: an identity whose value or input is changed in place later (the clone is then a
real copy that keeps the old value), and casts that change the dtype or shape.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtmc.module.fxjson import target_name


def _cls(c) -> str:
    return f"{c.__module__}.{c.__qualname__}"


# more identity forms for module.fx_ops' tables (they classify as steps-free Pointwise nodes)
FUNCTIONS = {target_name(f): op for f, op in [
    (torch.clone, "identity"), (torch.detach, "identity"), (F.dropout1d, "dropout"), (F.dropout2d, "dropout"),
    (F.dropout3d, "dropout"), (F.alpha_dropout, "dropout"), (F.feature_alpha_dropout, "dropout"),
]}
METHODS = {"detach": "identity", "double": "cast", "type": "cast"}
MODULES = {_cls(c): "dropout" for c in (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                                         nn.FeatureAlphaDropout)}


def identity_nodes(g, sem: dict, mutations: list[tuple[str, str]]) -> dict[str, str]:
    """{identity node: the node whose value it repeats} for the classified graph `g`: a
    steps-free Pointwise (module.fx_ops) with one tensor input of its own shape and dtype."""
    mutated = {value for _, value in mutations}
    found = {}
    for n in g.nodes:
        name, s = n["name"], sem.get(n["name"])
        if s is None or getattr(s, "binop", 1) is not None or s.steps or s.covers or len(s.inputs) != 1:
            continue
        src = getattr(s.inputs[0], "name", None)
        if src is None or g.tensor(src) is None or g.tensor(src) != g.tensor(name):
            continue
        if name in mutated or src in mutated:   # a copy that keeps a value an in-place op changes
            continue
        found[name] = found.get(src, src)       # a chain of identities reads the first input
    return found


def _redirect(arg, to: dict[str, str]):
    """The JSON argument with every reference to a dropped node turned into its input."""
    if isinstance(arg, list):
        return [_redirect(a, to) for a in arg]
    if isinstance(arg, dict):
        if set(arg) == {"node"}:
            return {"node": to.get(arg["node"], arg["node"])}
        return {k: _redirect(v, to) for k, v in arg.items()}
    return arg


def without_identities(desc: dict, dropped: dict[str, str]) -> dict:
    """A copy of the captured graph `desc` whose nodes read past the dropped identities, which
    it leaves out: a node kept there would still count as a user of its input, and a pattern
    asking for a single user (softmax -> dropout -> P @ v in attention) would not match (the
    caller's desc is left as it is: the assembler rewrites the original)."""
    if not dropped:
        return desc
    nodes = [{**n, "args": _redirect(n["args"], dropped), "kwargs": _redirect(n["kwargs"], dropped)}
             for n in desc["nodes"] if n["name"] not in dropped]
    return {**desc, "nodes": nodes}
