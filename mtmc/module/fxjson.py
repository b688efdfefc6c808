"""A torch.fx graph as plain JSON, and back.

Capture runs the user's module in a sandboxed child; the app's process must never import that
file, so the graph crosses over as data: every node's op, target, arguments, and what it
produced when the module ran (tensor shape and dtype, or a small Python value such as a size).
The app rebuilds an fx.Graph from it (no module needed) to rewrite it and to let torch.fx write
the new forward's code.

Function targets travel as qualified names and are resolved only under torch, operator, math,
builtins and einops (an installed library, never the upload's own code), so rebuilding a graph
never imports anything the upload wrote.
"""
from __future__ import annotations

import builtins
import importlib
import math

import torch
import torch.fx as fx
from torch.fx.node import _get_qualified_name

# Installed tensor libraries whose calls capture records whole (their functions check the tensor's
# type, so fx's proxy cannot go through them; capture._opaque_libraries).
OPAQUE_LIBRARIES = ("einops",)
# Roots a call_function target may be resolved under in the app's process.
_ROOTS = ("torch", "operator", "_operator", "math", "builtins", *OPAQUE_LIBRARIES)


class Unreproducible(ValueError):
    """A node the app could not rebuild: an argument or target that is not plain data."""


# -- arguments -------------------------------------------------------------------------------

def encode_arg(a):
    """A node argument as JSON; tagged dicts mark what JSON has no type for."""
    if isinstance(a, fx.Node):
        return {"node": a.name}
    if a is None or isinstance(a, (bool, int, str)):
        return a
    if isinstance(a, float):
        return a if math.isfinite(a) else {"float": repr(a)}
    if isinstance(a, tuple):  # torch.Size included
        return {"tuple": [encode_arg(x) for x in a]}
    if isinstance(a, list):
        return [encode_arg(x) for x in a]
    if isinstance(a, dict) and all(isinstance(k, str) for k in a):
        return {"dict": {k: encode_arg(v) for k, v in a.items()}}
    if isinstance(a, slice):
        return {"slice": [encode_arg(a.start), encode_arg(a.stop), encode_arg(a.step)]}
    if a is Ellipsis:
        return {"ellipsis": True}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).removeprefix("torch.")}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, (torch.memory_format, torch.layout)):
        return {"torch": str(a).removeprefix("torch.")}
    raise Unreproducible(f"an argument of type {type(a).__name__} ({str(a)[:60]})")


def decode_arg(a, nodes: dict):
    """Inverse of encode_arg; `nodes` maps names to the rebuilt graph's nodes (or any values)."""
    if isinstance(a, list):
        return [decode_arg(x, nodes) for x in a]
    if not isinstance(a, dict):
        return a
    (tag, v), = a.items()
    if tag == "node":
        return nodes[v]
    if tag == "float":
        return float(v)
    if tag == "tuple":
        return tuple(decode_arg(x, nodes) for x in v)
    if tag == "dict":
        return {k: decode_arg(x, nodes) for k, x in v.items()}
    if tag == "slice":
        return slice(*(decode_arg(x, nodes) for x in v))
    if tag == "ellipsis":
        return Ellipsis
    if tag == "dtype":
        return getattr(torch, v)
    if tag == "device":
        return torch.device(v)
    if tag == "torch":
        return getattr(torch, v)
    raise ValueError(f"unknown argument tag {tag!r}")


def arg_nodes(a) -> list[str]:
    """Names of the nodes an encoded argument refers to, in order."""
    if isinstance(a, list):
        return [n for x in a for n in arg_nodes(x)]
    if not isinstance(a, dict):
        return []
    (tag, v), = a.items()
    if tag == "node":
        return [v]
    if tag in ("tuple", "slice"):
        return [n for x in v for n in arg_nodes(x)]
    if tag == "dict":
        return [n for x in v.values() for n in arg_nodes(x)]
    return []


# -- targets ---------------------------------------------------------------------------------

def target_name(target) -> str:
    return _get_qualified_name(target)


def resolve_target(name: str):
    """The callable a qualified name denotes, looked up only under the allowed roots."""
    parts = name.split(".")
    if len(parts) == 1:
        if not hasattr(builtins, name):
            raise Unreproducible(f"function {name!r} is not a builtin")
        return getattr(builtins, name)
    if parts[0] not in _ROOTS:
        raise Unreproducible(f"function {name} is outside torch, operator, math and einops")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        raise Unreproducible(f"function {name}: {parts[0]} is not installed here") from None
    for p in parts[1:]:
        if not hasattr(obj, p):
            raise Unreproducible(f"function {name} does not exist in this torch")
        obj = getattr(obj, p)
    return obj


# -- values a node produced ---------------------------------------------------------------------

def describe_value(v):
    """What a node produced, as JSON: a tensor's shape and dtype, a small Python value, a
    tuple of those, or {"other": type name}."""
    if isinstance(v, torch.Tensor):
        return {"tensor": {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}}
    if isinstance(v, (tuple, list)):
        return {"seq": [describe_value(x) for x in v]}
    if v is None or isinstance(v, (bool, int, float, str)):
        return {"value": encode_arg(v)}
    if isinstance(v, torch.dtype):
        return {"value": encode_arg(v)}
    return {"other": type(v).__name__}


def encode_node(n: fx.Node, value: dict | None) -> dict:
    """A node as JSON; `value` is describe_value() of what it produced (None: not run)."""
    if n.op == "call_function":
        name = target_name(n.target)
        if resolve_target(name) is not n.target:
            raise Unreproducible(f"function {name} does not resolve back to itself")
        target = name
    else:
        target = str(n.target)
    return {"name": n.name, "op": n.op, "target": target, "args": encode_arg(tuple(n.args)),
            "kwargs": encode_arg(dict(n.kwargs)), "value": value if value is not None else describe_value(None)}


def rebuild_graph(nodes: list[dict]) -> tuple[fx.Graph, dict[str, fx.Node]]:
    """An fx.Graph with the same nodes (and node names) as a captured description."""
    g = fx.Graph()
    made: dict[str, fx.Node] = {}
    for d in nodes:
        target = resolve_target(d["target"]) if d["op"] == "call_function" else d["target"]
        args = decode_arg(d["args"], made)
        kwargs = decode_arg(d["kwargs"], made)
        made[d["name"]] = g.create_node(d["op"], target, tuple(args), kwargs, name=d["name"])
    return g, made
