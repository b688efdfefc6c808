"""Pure views inside a fusion group: a pointwise tail (or prologue) read through view / reshape /
flatten / unflatten / squeeze / unsqueeze.

`x.view(b, c, -1)` before a softmax over the flattened dims and `.view(b, c, d, h, w)` after it,
`instance_norm(x.unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1)`: such a view only regroups the
dims or adds / removes size-1 ones, so every element keeps its row-major index.  Every kernel of
the row-wise families (softmax, log_softmax, norms, reductions) indexes its tensors by that
row-major index (a periodic operand meets element i at (i // every) % period, pointwise's rule),
so the pointwise steps on the other side of the view are steps on the same elements, in the same
order: the group takes them, and only the shapes change.

  * an operand read in place (one value, a periodic broadcast) is described in the shape where the
    step meets it: its (every, period) are row-major facts, the same in the kernel's shape;
  * an operand read at full size is viewed into the kernel's shape by the wrapper
    (`y.expand(S).reshape(kernel shape)`; the input's "space": [kernel shape, S]);
  * a vector operand (a bias along the last dim) stays one only while the last dim is the
    kernel's; otherwise it is a periodic operand;
  * the main input read before a view in the prologue is reshaped to the kernel's shape first
    (the group's out "in_view"), and the result is viewed to the tail's shape last ("view").
Shapes are recorded at capture; the wrapper maps them to the shapes it is called with by
`_mtmc_view_shape` (kept and merged dims follow the call, split ones keep their recorded inner
sizes), and says so when it cannot.

A transpose or permute reorders the elements against that index: the chain ends there (the
group's notes say why), as it does at any other op.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from mtmc.module.fx_ops import TRANSPOSES, NodeRef, _cls, q

VIEW_METHODS = {"view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as", "reshape_as"}
VIEW_FUNCTIONS = {q(torch.reshape), q(torch.flatten), q(torch.unflatten), q(torch.squeeze), q(torch.unsqueeze)}
VIEW_MODULES = {_cls(nn.Flatten), _cls(nn.Unflatten)}
REORDER_METHODS = {"permute", "transpose", "t", "movedim", "moveaxis", "swapaxes", "swapdims"}
REORDER_FUNCTIONS = TRANSPOSES | {q(torch.permute), q(torch.movedim), q(torch.moveaxis), q(torch.swapaxes),
                                  q(torch.swapdims)}
REORDERS = ("a transpose / permute reorders the elements against the kernel's row-major index, so the "
            "pointwise tail after it runs in a pass of its own")


def source(g, name: str) -> NodeRef | None:
    """The tensor that node `name` is a pure view of (same dtype, same number of elements, the
    elements in the same row-major order), else None."""
    n = g.by_name[name]
    op, target = n["op"], n["target"]
    if not ((op == "call_method" and target in VIEW_METHODS) or (op == "call_function" and target in VIEW_FUNCTIONS)
            or (op == "call_module" and g.modules.get(target, {}).get("type") in VIEW_MODULES)):
        return None
    args, _ = g.args(name)
    x = args[0] if args else None
    t, tx = g.tensor(name), (g.tensor(x) if isinstance(x, NodeRef) else None)
    if t is None or tx is None or t[1] != tx[1] or math.prod(t[0]) != math.prod(tx[0]) or not math.prod(t[0]):
        return None   # view(dtype) reinterprets the bits; an empty tensor has nothing to fuse
    return x


def reorders(g, name: str) -> bool:
    n = g.by_name[name]
    return (n["op"] == "call_method" and n["target"] in REORDER_METHODS) or \
        (n["op"] == "call_function" and n["target"] in REORDER_FUNCTIONS)


def run_after(p, start: str) -> tuple[list[str], str] | None:
    """From `start` (the single reader of the running value): the run of pure views there, each
    the single reader of the one before, and the node reading the last one; ([], start) when
    start is no view; None when the run ends at a view read by several nodes or by none."""
    views, cur = [], start
    while source(p.g, cur) is not None and cur not in p.taken:
        views.append(cur)
        cur = p._single_user(cur)
        if cur is None:
            return None
    return views, cur


def context(kshape: list[int], shape: list[int], operand_view: dict, vector_ok: bool) -> tuple[dict, bool]:
    """(operand view, whether vector operands are allowed) for steps that meet their operands in
    `shape` while the kernel runs over `kshape` (the same elements, regrouped)."""
    if list(shape) == list(kshape):
        return operand_view, vector_ok
    return {**operand_view, "space": [list(kshape), list(shape)]}, vector_ok and shape[-1:] == kshape[-1:]


def stopped(p, b, node: str, where: str) -> None:
    """Note on builder `b` why its chain ends at `node` when a view is the reason."""
    if reorders(p.g, node):
        b.notes.append(f"the {where} ends at {p.g.words(node)}: {REORDERS}")


def note_refused(p, b, views: list[str], node: str, where: str) -> None:
    """Note why a pointwise node after a run of views stays out of the group."""
    if node in p.sem and node not in p.taken:
        b.notes.append(f"the {where} ends at {p.g.words(node)} after the view {p.g.words(views[-1])}: it does not "
                       "continue the chain in the kernel's index space (an operand broadcast the kernel cannot "
                       "read in place, another shape or dtype)")


# metadata a group's output shares with every value inside it, whatever the views between them
_SHAPE_FREE = {"device", "dtype", "is_cuda", "is_floating_point", "numel"}


class Stranded(Exception):
    """A group reading through a view would leave a value inside it whose shape is read later: the
    assembler could not point that reader at the group's output (another shape), so PyTorch would
    compute the value as well.  The partitioner builds the group again without views."""


def stranded(p, nodes: list[str], replaces: list[str]) -> list[str]:
    """Nodes of a group (besides those it replaces) whose shape is read by a node outside it
    (`x.shape`, `x.size(0)`) while differing from the group's output's shape."""
    out = {tuple(p.g.tensor(r)[0]) for r in replaces if p.g.tensor(r)}
    inside = set(nodes)
    found = []
    for reader, kind in p.g.reads_metadata.items():
        if kind in _SHAPE_FREE or reader in inside:
            continue
        args, _ = p.g.args(reader)
        read = args[0].name if args and isinstance(args[0], NodeRef) else None
        t = p.g.tensor(read) if read in inside and read not in replaces else None
        if t is not None and {tuple(t[0])} != out:
            found.append(read)
    return found


# The wrapper's helper (module.assemble's prelude): the shape a recorded view gives now.
SHAPE_HELPER = '''
def _mtmc_view_shape(now, then, to):
    """The shape a view that took shape `then` to `to` (recorded at capture) gives a tensor of
    shape `now`: `to` itself when now is then; else dims kept or merged follow `now`, a split dim
    keeps its recorded inner sizes."""
    now, then, to = tuple(now), tuple(then), tuple(to)
    if now == then:
        return to
    if len(now) != len(then):
        raise ValueError(f"a view fused into a group was recorded for {then}, called with {now}")
    out, i, j = [], 0, 0
    while i < len(then) or j < len(to):
        if j < len(to) and to[j] == 1 and (i == len(then) or then[i] != 1):
            out.append(1)   # an added size-1 dim
            j += 1
            continue
        if i < len(then) and then[i] == 1 and (j == len(to) or to[j] != 1):
            if now[i] != 1:
                raise ValueError(f"a view fused into a group removed dim {i} of size 1; called with {now}")
            i += 1
            continue
        i0, j0, a, b = i, j, then[i], to[j]
        i, j = i + 1, j + 1
        while a != b:   # the smallest runs of dims with one product
            if a < b:
                a, i = a * then[i], i + 1
            else:
                b, j = b * to[j], j + 1
        src, dst = now[i0:i], to[j0:j]
        if src == then[i0:i]:
            out += dst
        elif len(dst) == 1:
            out.append(_mtmc_prod(src))
        elif len(src) == 1 and _mtmc_prod(dst[1:]) and src[0] % _mtmc_prod(dst[1:]) == 0:
            out += [src[0] // _mtmc_prod(dst[1:]), *dst[1:]]
        else:
            raise ValueError(f"a view fused into a group was recorded as {then} -> {to}; called with {now}")
    return tuple(out)


def _mtmc_prod(dims):
    n = 1
    for s in dims:
        n *= s
    return n
'''

_ns: dict = {}
exec(SHAPE_HELPER, _ns)
view_shape = _ns["_mtmc_view_shape"]   # the same function, callable here (the tests check it)
