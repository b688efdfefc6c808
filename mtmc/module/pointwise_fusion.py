"""Pointwise pieces of the graph stage: formulas that read one value twice as one step (the
fork pass), and tril/triu after a matmul as steps of its epilogue.

A hand-written activation reads its input on two paths that meet again: HardSwish as
`x * torch.clamp((x + 3) / 6, 0, 1)`, Mish as `x * torch.tanh(F.softplus(x))`, minGPT's NewGELU
as `0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))`.
Each path alone is a chain of one-input steps, but the value they start from has two users, so
no chain can run through it.  `collapse(partitioner)` finds every binary pointwise node whose two
inputs go back, through steps used only on that path, to one value x, and makes the node one
step on x: a pointwise "fork" (binop(left(x), right(x))), or the named op it equals when there
is one (hardswish, mish, gelu_tanh, silu ...: checked numerically on a grid, so any spelling of
the formula is caught).  Inner forks collapse first (graph order), so nested ones (NewGELU's
x + 0.044715 * x^3) become steps of the outer fork's paths.
"""
from __future__ import annotations

import math

import torch

from mtmc.kernels import pointwise
from mtmc.module import view_fusion
from mtmc.module.fx_ops import NodeRef, Pointwise

# Named ops a fork may be: every one-input step without a parameter.
CANDIDATES = [{"op": op} for op in pointwise.UNARY]
# Where a fork and a named op are compared: dense around 0, out to where activations saturate.
_GRID = torch.cat([torch.linspace(-12, 12, 2401, dtype=torch.float64),
                   torch.tensor([-1e3, -60.0, -30.0, 30.0, 60.0, 1e3], dtype=torch.float64)])


def scalar_steps(binop: str, num: float, x_first: bool) -> list[dict] | None:
    """Steps for x (binop) num, or num (binop) x."""
    if not math.isfinite(num):
        return None
    if binop == "add":
        return [{"op": "shift", "value": num}]
    if binop == "sub":
        return [{"op": "shift", "value": -num}] if x_first else [{"op": "neg"}, {"op": "shift", "value": num}]
    if binop == "mul":
        return [{"op": "scale", "value": num}]
    if binop == "div":
        if x_first:
            return [{"op": "scale", "value": 1.0 / num}] if num else None
        return [{"op": "reciprocal"}] + ([{"op": "scale", "value": num}] if num != 1 else [])
    if binop in ("maximum", "minimum"):
        return [{"op": "clamp_min" if binop == "maximum" else "clamp_max", "value": num}]
    return None


def _one_input(s) -> tuple[NodeRef, list[dict]] | None:
    """(its input, its steps) for a pointwise node of one tensor input (literal numbers only)."""
    if not isinstance(s, Pointwise):
        return None
    if s.binop is None:
        return (s.inputs[0], list(s.steps)) if s.inputs and isinstance(s.inputs[0], NodeRef) else None
    a, b = s.inputs
    for x, num, first in ((a, b, True), (b, a, False)):
        if isinstance(x, NodeRef) and isinstance(num, (int, float)) and not isinstance(num, bool):
            steps = scalar_steps(s.binop, float(num), first)
            return (x, steps) if steps is not None else None
    return None


def _path(p, ref, consumer: str, shape) -> tuple[str, list[dict], list[str]]:
    """Back from `ref` (an input of `consumer`) through one-input steps each used only by the
    next: (the value it starts from, the steps in order, the nodes passed)."""
    steps, nodes, cur = [], [], ref.name
    while True:
        one = _one_input(p.sem.get(cur))
        if one is None or p.g.users[cur] != [consumer] or p.g.tensor(cur) != shape or cur in p.taken:
            return cur, steps, nodes
        src, more = one
        steps = more + steps
        nodes += [cur, *p.sem[cur].covers]
        consumer, cur = cur, src.name


def operand_path(p, ref: NodeRef, consumer: str, b) -> tuple[NodeRef, list[dict], list[str]]:
    """(the tensor read, the steps applied to it, their nodes) for a binop's operand `ref`: back
    through one-input steps used only on this path (relu(y) of relu(x) + relu(y)), so a formula
    of two tensors is one kernel instead of one per branch; (ref, [], []) when there are none."""
    t = p.g.tensor(ref)
    root, steps, nodes = _path(p, ref, consumer, t)
    if (not steps or p.g.tensor(root) != t or root in b.nodes or any(n in b.nodes for n in nodes)
            or pointwise.uses_index(steps)):
        return ref, [], []
    return NodeRef(root), steps, nodes


def _same(a: list[dict], b: list[dict]) -> bool:
    with torch.no_grad():
        ns = {"torch": torch, "math": math}
        try:
            exec("fa = lambda x: " + pointwise.torch_expr(a, "x", {}) + "\nfb = lambda x: "
                 + pointwise.torch_expr(b, "x", {}), ns)
            ya, yb = ns["fa"](_GRID.clone()), ns["fb"](_GRID.clone())
        except Exception:
            return False
        both_nan = torch.isnan(ya) & torch.isnan(yb)
        close = (ya - yb).abs() <= 1e-6 * (1 + yb.abs())
        return bool((close | both_nan).all())


def canonical(step: dict) -> list[dict]:
    """The named op a fork step equals (one multiply by a sub-step when it is x * f(x) with f
    known is not simplified further), else the fork itself."""
    for cand in CANDIDATES:
        if _same([step], [cand]):
            return [cand]
    return [step]


def collapse(p) -> None:
    """Turn every two-path formula of one value in p's graph into one step (see the module doc)."""
    for n in p.g.nodes:
        m, s = n["name"], p.sem.get(n["name"])
        if not isinstance(s, Pointwise) or s.binop not in pointwise.FORK_BINOPS or m in p.taken:
            continue
        if not all(isinstance(r, NodeRef) for r in s.inputs):
            continue
        shape = p.g.tensor(m)
        if any(p.g.tensor(r) != shape for r in s.inputs):
            continue
        (root_a, left, nodes_a), (root_b, right, nodes_b) = (_path(p, r, m, shape) for r in s.inputs)
        if root_a != root_b or not (left or right) or p.g.tensor(root_a) != shape:
            continue   # two different values (a true two-tensor op), or x * x (a square step)
        covers = nodes_a + nodes_b
        step = {"op": "fork", "binop": s.binop, "left": left, "right": right}
        p.sem[m] = Pointwise([NodeRef(root_a)], canonical(step), covers=[*s.covers, *covers])
        for c in covers:
            p.sem.pop(c, None)
            p.why[c] = f"computed inside the fused formula at {p.g.words(m)}"
        users = p.g.users[root_a]
        users[:] = [u for u in users if u not in covers and u != m] + [m]


def matmul_index_step(p, node: str, running: str, out_shape: list[int], batched: bool) -> list[dict] | None:
    """tril / triu of a matmul's output as its epilogue's steps (they read each element's row and
    column, which the matmul kernel knows): for a 2-d output, or a bmm's [..., M, N]."""
    s = p.sem.get(node)
    if not isinstance(s, Pointwise) or s.binop is not None or not pointwise.uses_index(s.steps):
        return None
    if s.inputs[0] != NodeRef(running) or node in p.taken or p.g.tensor(node) != p.g.tensor(running):
        return None
    return list(s.steps) if len(out_shape) == 2 or batched else None


def reduction_epilogue(p, out: str, b, views: bool = True) -> tuple[list[dict], str]:
    """The one-input steps after a reduction's result `out` (x.sum(-1) * s, logsumexp then relu),
    each the single user of the one before, read through pure views of the result
    (module.view_fusion; the result is viewed to the last step's shape, b.out_view): (steps,
    the last node), the nodes added to b."""
    steps, last = [], out
    while (user := p._single_user(last)) is not None:
        run = view_fusion.run_after(p, user) if views else ([], user)
        if run is None:
            break
        passed, node = run
        running = passed[-1] if passed else last
        one = _one_input(p.sem.get(node))
        if (one is None or one[0] != NodeRef(running) or node in p.taken
                or p.g.tensor(node) != p.g.tensor(running) or pointwise.uses_index(one[1])):
            view_fusion.stopped(p, b, node, "epilogue")
            break
        steps += one[1]
        b.nodes += [*passed, node, *p.sem[node].covers]
        if passed:
            b.out_view = [list(p.g.tensor(out)[0]), list(p.g.tensor(node)[0])]
        last = node
    return steps, last
