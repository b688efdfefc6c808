"""Ops no catalog family serves, as groups for the coder role with a model (issue 18).

With an LLM configured, each run of ops left to PyTorch as "outside the kernel catalog" (a node,
or a chain of them where each feeds only the next) becomes a `custom` group: its PyTorch
reference, written from the captured graph by torch.fx's own code generation, and its tensor
inputs with their shapes.  The module flow hands that to the coder role (agents.llm_coder), whose
kernel the guard accepts or refuses like any draft, and assembly calls the model's `ModelNew` in
the group's place.  Only float tensors in and one float tensor out; anything else stays PyTorch.
"""
from __future__ import annotations

import math
import re

import torch.fx as fx

from mtmc.kernels.spec import CUSTOM_FAMILY, KernelSpec
from mtmc.module.fusion import Group, Partition
from mtmc.module.fx_ops import Graph
from mtmc.module.fxjson import arg_nodes, decode_arg, resolve_target

FLOATS = ("float32", "float16", "bfloat16")
OUTSIDE = "outside the kernel catalog"
MAX_CHAIN = 8


def _inputs_of(d: dict) -> list[str]:
    return [*arg_nodes(d["args"]), *arg_nodes(d["kwargs"])]


def _chains(g: Graph, outside: list[str]) -> list[list[str]]:
    """Runs of outside nodes, each feeding only the next (graph order)."""
    left, chains = set(outside), []
    for name in outside:
        if name not in left:
            continue
        chain = [name]
        left.discard(name)
        while len(chain) < MAX_CHAIN and len(g.users[chain[-1]]) == 1:
            nxt = g.users[chain[-1]][0]
            if nxt not in left or _inputs_of(g.by_name[nxt]).count(chain[-1]) != 1:
                break
            chain.append(nxt)
            left.discard(nxt)
        chains.append(chain)
    return chains


def reference_source(g: Graph, chain: list[str]) -> tuple[str, list[str]] | None:
    """`def reference(...)` computing the chain from its outside tensor inputs (fx's code
    generation, so every argument form the capture keeps is written as PyTorch reads it), and
    those inputs' node names in argument order; None when it needs anything but tensors."""
    ref = fx.Graph()
    made: dict[str, fx.Node] = {}
    inputs: list[str] = []
    for name in chain:
        d = g.by_name[name]
        if d["op"] not in ("call_function", "call_method"):
            return None
        for a in _inputs_of(d):
            if a in made:
                continue
            t = g.tensor(a)
            if t is None or t[1] not in FLOATS:
                return None
            made[a] = ref.placeholder(a)
            inputs.append(a)
        target = resolve_target(d["target"]) if d["op"] == "call_function" else d["target"]
        made[name] = ref.create_node(d["op"], target, tuple(decode_arg(d["args"], made)),
                                     decode_arg(d["kwargs"], made), name=name)
    ref.output(made[chain[-1]])
    code = ref.python_code(root_module="self")
    src = code.src[code.src.index("def forward("):].replace("def forward(self, ", "def reference(", 1)
    used = {k for k in code.globals if re.search(rf"\b{re.escape(k)}\b", src)}
    if used - {"torch"}:   # a helper (math's inf, a device) the reference's namespace lacks
        return None
    return src.strip() + "\n", inputs


def custom_groups(captured: dict, part: Partition, first_id: int) -> list[Group]:
    """Custom groups for the ops `part` left to PyTorch as outside the catalog."""
    groups: list[Group] = []
    for desc in captured["graphs"]:
        g = Graph(desc)
        words = {t["node"]: t["op"] for t in part.torch_ops if t["graph"] == g.path}
        outside = [t["node"] for t in part.torch_ops if t["graph"] == g.path and t["why"] == OUTSIDE]
        for chain in _chains(g, outside):
            out = g.tensor(chain[-1])
            ref = reference_source(g, chain)
            if out is None or out[1] not in FLOATS or not math.prod(out[0]) or ref is None:
                continue
            source, inputs = ref
            shapes = [dict(zip(("shape", "dtype"), g.tensor(a))) for a in inputs]
            name = "_".join(n.rstrip("_0123456789") or n for n in chain)[:48]
            spec = KernelSpec(CUSTOM_FAMILY, name, {}, out[1], {"reference": source, "inputs": shapes})
            groups.append(Group(id=first_id + len(groups), graph=g.path, family=CUSTOM_FAMILY, nodes=list(chain),
                                replaces=[chain[-1]], ops=[words[n] for n in chain], spec=spec.to_dict(),
                                args=[{"node": a} for a in inputs],
                                inputs=[{"arg": i, "view": "as_is"} for i in range(len(inputs))],
                                out={"kind": CUSTOM_FAMILY}))
    return groups
