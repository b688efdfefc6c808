"""Statement-form in-place ops turned into values, in a traced fx graph.

`h = self.fc(x); h.relu_(); h.mul_(0.5); return h.sum(-1)` changes `h` without a new name, so
the graph reads `h` after the change through the node that made it before the change: every
group that reads h would have to be ordered around the in-place ops, so they stayed PyTorch.
Where nobody else can see the storage (h is a fresh tensor its producer allocated, not an input,
a parameter or a view, and no view of it was taken), `h.relu_()` is the same as `h2 = h.relu()`
with every later read of h reading h2.  `functionalize` does that rewrite at capture, in graph
order, so chains of in-place ops become chains of values.  Anything else is left as it was.

For what is left, the partition and the graph stage ask `storage_family`, `changed_elsewhere` and
`mutations` which values an in-place op changes: the value it is called on, the tensor that value
views and every view of either (a change through `h[:, :8]` changes h), but not the op's own
result and the views made from it, which every later reader wants changed.
"""
from __future__ import annotations

import operator

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtmc.module.fxjson import target_name

# Methods and functions whose result may share storage with their first argument.
ALIAS_METHODS = {
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze",
    "transpose", "permute", "t", "expand", "expand_as", "narrow", "select", "unbind", "split", "chunk",
    "tensor_split", "contiguous", "to", "type", "type_as", "float", "double", "half", "bfloat16", "detach",
    "as_strided", "diagonal", "movedim", "moveaxis", "swapaxes", "swapdims", "unfold", "mT", "mH", "real",
    "__getitem__", "view_as_real", "cpu", "cuda", "data", "requires_grad_", "align_to", "squeeze_", "unsqueeze_",
}
ALIAS_FUNCTIONS = {operator.getitem, torch.flatten, torch.reshape, torch.transpose, torch.permute,
                   torch.squeeze, torch.unsqueeze, torch.narrow, torch.select, torch.split, torch.chunk,
                   torch.t, torch.movedim, torch.diagonal, torch.detach, torch.unbind, torch.swapaxes,
                   torch.as_strided, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
                   torch.dropout, torch.atleast_1d, torch.atleast_2d, torch.atleast_3d}
ALIAS_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
                 nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
ALIAS_FUNCTION_NAMES = {target_name(f) for f in ALIAS_FUNCTIONS}
ALIAS_MODULE_NAMES = {f"{c.__module__}.{c.__qualname__}" for c in ALIAS_MODULES}
# In-place methods whose out-of-place twin is not the same computation, or that only change
# metadata or draw random numbers: left alone.
NOT_TWINS = {"bernoulli_", "uniform_", "normal_", "random_", "exponential_", "geometric_", "cauchy_",
             "log_normal_", "resize_", "resize_as_", "set_", "share_memory_", "requires_grad_", "detach_",
             "squeeze_", "unsqueeze_", "transpose_", "t_", "as_strided_", "swapaxes_", "swapdims_",
             "fill_", "zero_", "copy_", "retain_grad_", "fill_diagonal_"}


def _twin(node):
    """(out-of-place target, args, kwargs) for an in-place fx node, or None."""
    if node.op == "call_method" and isinstance(node.target, str) and node.target.endswith("_") \
            and not node.target.startswith("_") and node.target not in NOT_TWINS \
            and callable(getattr(torch.Tensor, node.target[:-1], None)):
        return node.target[:-1], node.args, dict(node.kwargs)
    if node.op == "call_function":
        if node.kwargs.get("inplace") is True:
            return node.target, node.args, {**node.kwargs, "inplace": False}
        name = getattr(node.target, "__name__", "")
        owner = F if getattr(F, name, None) is node.target else torch if getattr(torch, name, None) is node.target \
            else None
        if owner is not None and name.endswith("_") and not name.startswith("_") and name not in NOT_TWINS \
                and callable(getattr(owner, name[:-1], None)):
            return getattr(owner, name[:-1]), node.args, dict(node.kwargs)
    return None


def _in_place(op: str, target: str, kwargs: dict, module: dict | None) -> bool:
    """Whether a call changes its first argument in place: x.relu_(), torch.relu_(x),
    F.relu(x, inplace=True), nn.ReLU(inplace=True) (module: its info, {"type", "attrs"})."""
    if op == "call_module":
        return bool((module or {}).get("attrs", {}).get("inplace"))
    name = target.rsplit(".", 1)[-1]
    return (name.endswith("_") and not name.startswith("_")) or kwargs.get("inplace") is True


def may_alias(op: str, target: str, kwargs: dict, module: dict | None = None) -> bool:
    """Whether a node's value may share storage with another value (an input, a parameter, the
    value it was made from), from its op, its target's name, its keywords and, for a module call,
    the module's info ({"type", "attrs"}).  Modules of user code count as may-alias: they could
    return their input."""
    if op in ("placeholder", "get_attr", "output"):
        return True
    if _in_place(op, target, kwargs, module):
        return True
    if op == "call_method":
        return target in ALIAS_METHODS
    if op == "call_function":
        return target in ALIAS_FUNCTION_NAMES
    module = module or {}
    return module.get("type") in ALIAS_MODULE_NAMES or not str(module.get("type", "")).startswith("torch.")


def _fx_may_alias(node, mod) -> bool:
    module = None
    if node.op == "call_module":
        sub = mod.get_submodule(node.target)
        module = {"type": f"{type(sub).__module__}.{type(sub).__qualname__}",
                  "attrs": {"inplace": getattr(sub, "inplace", False)}}
    target = node.target if isinstance(node.target, str) else target_name(node.target)
    return may_alias(node.op, target, dict(node.kwargs), module)


def functionalize(graph, mod) -> list[str]:
    """Rewrite, in place in `graph`, each in-place op on a fresh value into its out-of-place twin
    whose result later nodes read instead.  Returns the names of the nodes rewritten."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    done = []
    for node in list(graph.nodes):
        twin = _twin(node)
        if twin is None or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        x = node.args[0]
        if _fx_may_alias(x, mod):
            continue
        # a view of x taken before the change and read after it would see the change
        if any(u is not node and _fx_may_alias(u, mod) and order[u] < order[node] for u in x.users):
            continue
        node.target, node.args, node.kwargs = twin
        for u in list(x.users):
            if u is not node and order[u] > order[node]:
                u.replace_input_with(x, node)
        done.append(node.name)
    return done


def storage_family(g, name: str) -> tuple[str, set[str]]:
    """(root, members) of the values sharing `name`'s storage in a captured graph (fx_ops.Graph):
    the value it views, through alias ops, back to one that made its own storage (or an input or
    parameter), and every alias made from that root."""
    def aliased(n: str) -> bool:
        node = g.by_name[n]
        return node["op"].startswith("call_") and may_alias(
            node["op"], node["target"], node.get("kwargs") or {}, g.modules.get(node["target"]))

    def source(n: str):
        args, _ = g.args(n)
        return args[0].name if args and hasattr(args[0], "name") else None

    root = name
    while aliased(root) and source(root):
        root = source(root)
    members, todo = {root}, [root]
    while todo:
        for u in g.users[todo.pop()]:
            if u not in members and aliased(u) and source(u) in members:
                members.add(u)
                todo.append(u)
    return root, members


def changed_elsewhere(g, name: str) -> set[str]:
    """The values in-place node `name` changes besides its own result: the value it is called on
    and every value sharing that storage, less its result and the views made from that result
    (those are read after the change by construction)."""
    args, _ = g.args(name)
    if not args or not hasattr(args[0], "name"):
        return set()
    _, family = storage_family(g, args[0].name)
    after, todo = {name}, [name]
    while todo:
        for u in g.users[todo.pop()]:
            if u in family and u not in after:
                after.add(u)
                todo.append(u)
    return family - after


def changes_in_place(g, name: str) -> bool:
    """Whether node `name` of a captured graph changes its first argument in place: x.relu_(),
    torch.relu_(x), F.relu(x, inplace=True), nn.ReLU(inplace=True)."""
    n = g.by_name[name]
    return n["op"].startswith("call_") and _in_place(n["op"], n["target"], n.get("kwargs") or {},
                                                     g.modules.get(n["target"]))


def mutations(g) -> list[tuple[str, str]]:
    """(in-place node, a value it changes) over a captured graph: the value it is called on and
    every value sharing that storage (views of it, the tensor it views), as changed_elsewhere."""
    return [(n["name"], m) for n in g.nodes if changes_in_place(g, n["name"])
            for m in sorted(changed_elsewhere(g, n["name"]))]
