"""Editing one captured graph (module.capture's JSON, the form every later stage reads).

A rewrite copies the graph's description, inserts new nodes (each with the shape and dtype it
will produce, so the partitioner can read them like captured ones), points the readers of the
old value at the new one, and drops what only fed the old value.  Targets are written as the
qualified names module.fxjson resolves (torch.sum, _operator.mul ...), so the assembler turns
the edited graph into ModelNew's forward exactly as it does a captured one.
"""
from __future__ import annotations

import copy
import math

from mtmc.module.fx_ops import Graph, NodeRef
from mtmc.module.fxjson import arg_nodes, encode_arg

PURE_OPS = ("call_function", "call_method", "get_attr")
# functions that change buffers in place when training (batch norm's running statistics): never dead
STATEFUL_FUNCTIONS = ("torch.nn.functional.batch_norm", "torch.nn.functional.instance_norm")


def pure(n: dict, modules: set[str] = frozenset()) -> bool:
    """Whether node `n` may go when nothing reads it: a function or method changing nothing in
    place, or a module call named in `modules` (those known to keep no state)."""
    return ((n["op"] in PURE_OPS and n["target"] not in STATEFUL_FUNCTIONS) or n["name"] in modules) \
        and not n["target"].rsplit(".", 1)[-1].endswith("_")


def tensor_value(shape, dtype: str) -> dict:
    return {"tensor": {"shape": [int(s) for s in shape], "dtype": dtype}}


def encode(a):
    """Python values (NodeRef for a node) as fxjson arguments."""
    if isinstance(a, NodeRef):
        return {"node": a.name}
    if isinstance(a, tuple):
        return {"tuple": [encode(x) for x in a]}
    if isinstance(a, list):
        return [encode(x) for x in a]
    if isinstance(a, dict):
        return {"dict": {k: encode(v) for k, v in a.items()}}
    return encode_arg(a)


class Editor:
    """A copy of one graph description being edited; `desc` is the result."""

    def __init__(self, desc: dict):
        self.desc = copy.deepcopy(desc)
        self.names = {n["name"] for n in self.desc["nodes"]}
        self.made: list[str] = []

    @property
    def nodes(self) -> list[dict]:
        return self.desc["nodes"]

    def index(self, name: str) -> int:
        return next(i for i, n in enumerate(self.nodes) if n["name"] == name)

    def fresh(self, base: str) -> str:
        base = "rw_" + base.replace(".", "_")
        name, i = base, 1
        while name in self.names:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        return name

    def add(self, before: str, base: str, op: str, target: str, args: tuple, kwargs: dict | None, shape,
            dtype: str, scalar=None) -> NodeRef:
        """A new node right before `before`; returns a reference to it.  `scalar`: the node makes
        a Python number (a size), recorded as its value instead of a tensor."""
        name = self.fresh(base)
        value = {"value": encode_arg(scalar)} if shape is None else tensor_value(shape, dtype)
        node = {"name": name, "op": op, "target": target, "args": encode(tuple(args)),
                "kwargs": encode(dict(kwargs or {})), "value": value}
        self.nodes.insert(self.index(before), node)
        self.made.append(name)
        line_of = self.desc.setdefault("line_of", {})
        if before in line_of:   # reports name the new node by the line of what it replaces
            line_of[name] = line_of[before]
        return NodeRef(name)

    def param(self, before: str, path: str, shape, dtype: str) -> NodeRef:
        """A read of a parameter or buffer (`self.<path>`), each read once per edit."""
        for n in self.nodes:
            if n["op"] == "get_attr" and n["target"] == path and n["name"] in self.made:
                if self.index(n["name"]) < self.index(before):
                    return NodeRef(n["name"])
        return self.add(before, path, "get_attr", path, (), {}, shape, dtype)

    def node(self, name: str) -> dict:
        return self.nodes[self.index(name)]

    def replace_uses(self, old: str, new: NodeRef, after: str | None = None) -> None:
        """Every reader of `old` (except the new nodes and `after`'s predecessors) reads `new`."""
        start = self.index(after) + 1 if after else 0
        for n in self.nodes[start:]:
            if n["name"] not in self.made:   # the new nodes read what they were built to read
                self.replace_in(n["name"], old, new)

    def replace_in(self, name: str, old: str, new: NodeRef) -> None:
        """Node `name` reads `new` wherever it read `old`."""
        def swap(a):
            if isinstance(a, list):
                return [swap(x) for x in a]
            if isinstance(a, dict):
                if set(a) == {"node"}:
                    return {"node": new.name} if a["node"] == old else a
                return {k: swap(v) for k, v in a.items()}
            return a
        n = self.node(name)
        n["args"], n["kwargs"] = swap(n["args"]), swap(n["kwargs"])

    def drop_dead(self, had_users: set[str], modules: set[str] = frozenset()) -> list[str]:
        """Remove pure nodes that had readers before the edit and have none now (module calls
        only when named in `modules`: a linear map or an eval BatchNorm the edit replaced); their
        names."""
        dropped = []
        changed = True
        while changed:
            changed = False
            used = {u for n in self.nodes for u in arg_nodes(n["args"]) + arg_nodes(n["kwargs"])}
            for n in list(self.nodes):
                if n["name"] not in used and n["name"] in had_users and pure(n, modules):
                    self.nodes.remove(n)
                    dropped.append(n["name"])
                    changed = True
        return dropped


RANDOM_FUNCTIONS = frozenset(f"torch.{f}" for f in ("rand", "randn", "randint", "rand_like", "randn_like", "randint_like",
                                                    "bernoulli", "multinomial", "normal", "randperm")) | frozenset(
    f"torch.nn.functional.{f}" for f in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                                         "feature_alpha_dropout"))
RANDOM_METHODS = frozenset(("bernoulli", "bernoulli_", "uniform_", "normal_", "random_", "exponential_"))


def draws_random(modules: dict, n: dict) -> bool:
    """Node `n` (of a graph whose module calls `modules` describes) draws from the random number
    generator (dropout in training mode, rand...)."""
    if n["op"] == "call_module":
        info = modules.get(n["target"], {})
        attrs = info.get("attrs", {})
        return "Dropout" in info.get("type", "") and attrs.get("training", True) and attrs.get("p", 0) > 0
    return (n["op"] == "call_function" and n["target"] in RANDOM_FUNCTIONS) or \
        (n["op"] == "call_method" and n["target"] in RANDOM_METHODS)


def stateless_module_calls(desc: dict) -> set[str]:
    """Module calls that may be dropped when nothing reads them: all but those updating their
    buffers (a norm tracking running statistics in training mode)."""
    mods = desc.get("modules", {})
    out = set()
    for n in desc["nodes"]:
        if n["op"] == "call_module":
            attrs = mods.get(n["target"], {}).get("attrs", {})
            if not (attrs.get("track_running_stats") and attrs.get("training", True)):
                out.add(n["name"])
    return out


def readers(desc: dict) -> set[str]:
    """Names of the nodes something reads."""
    return set(u for n in desc["nodes"] for u in arg_nodes(n["args"]) + arg_nodes(n["kwargs"]))


def numel(shape) -> int:
    return math.prod(shape) if shape else 1


def graph(desc: dict) -> Graph:
    return Graph(desc)
