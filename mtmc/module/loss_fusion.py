"""Losses in a captured graph: the loss functions and modules of torch.nn become "loss" anchors
(module.fx_ops asks here), and a mean or sum over a whole tensor computed from two tensors (a
hand-written loss: torch.mean((pred - target) ** 2), torch.mean(torch.clamp(1 - pred * target,
min=0))) becomes the loss family's "total" with the pointwise ops before it as its prologue.

Forms: F.mse_loss / l1_loss / smooth_l1_loss / huber_loss / kl_div / hinge_embedding_loss /
cross_entropy / triplet_margin_loss / cosine_embedding_loss / cosine_similarity with positional or
keyword arguments and their defaults, and the nn.*Loss / nn.CosineSimilarity modules.  A row loss
with reduction 'none' (or cosine_similarity) takes the scalar pointwise ops after it and then a
torch.mean / torch.sum over everything (torch.mean(1 - F.cosine_similarity(a, b))).  Near misses
(class weights, probability targets, broadcast targets, the deprecated
size_average / reduce) are refused with the reason.  torch.log(p) feeding kl_div is read in the
kernel.
"""
from __future__ import annotations

import inspect
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtmc.module.fx_ops import Anchor, NodeRef, Pointwise, Reject, _cls, q

# torch function -> (loss op, its parameter names in order)
_FUNCTIONS = {F.mse_loss: "mse", F.l1_loss: "l1", F.smooth_l1_loss: "smooth_l1", F.huber_loss: "huber",
              F.kl_div: "kl_div", F.hinge_embedding_loss: "hinge_embedding", F.cross_entropy: "cross_entropy",
              F.triplet_margin_loss: "triplet_margin", F.cosine_embedding_loss: "cosine_embedding"}
LOSS_FUNCTIONS = {q(f): (op, list(inspect.signature(f).parameters)) for f, op in _FUNCTIONS.items()}
LOSS_FUNCTIONS[q(F.cosine_similarity)] = ("cosine_similarity", ["x1", "x2", "dim", "eps"])
LOSS_MODULES = {_cls(c): op for c, op in [
    (nn.MSELoss, "mse"), (nn.L1Loss, "l1"), (nn.SmoothL1Loss, "smooth_l1"), (nn.HuberLoss, "huber"),
    (nn.KLDivLoss, "kl_div"), (nn.HingeEmbeddingLoss, "hinge_embedding"), (nn.CrossEntropyLoss, "cross_entropy"),
    (nn.TripletMarginLoss, "triplet_margin"), (nn.CosineEmbeddingLoss, "cosine_embedding"),
    (nn.CosineSimilarity, "cosine_similarity")]}
# how many tensors each op reads, and the settings it takes (name -> PyTorch's default)
TENSORS = {"triplet_margin": 3, "cosine_embedding": 3}
SETTINGS = {"smooth_l1": {"beta": 1.0}, "huber": {"delta": 1.0}, "kl_div": {"log_target": False},
            "hinge_embedding": {"margin": 1.0}, "cross_entropy": {"ignore_index": -100, "label_smoothing": 0.0},
            "triplet_margin": {"margin": 1.0, "p": 2.0, "eps": 1e-6, "swap": False},
            "cosine_embedding": {"margin": 0.0}, "cosine_similarity": {"eps": 1e-8}}
ROW_OPS = ("cross_entropy", "triplet_margin", "cosine_similarity", "cosine_embedding")
LOG = {q(torch.log)}


def _settings(op: str, given: dict) -> dict:
    """The call's settings checked: the ones this kernel cannot honour are refused."""
    for key in ("size_average", "reduce"):
        if given.get(key) is not None:
            raise Reject(f"{op}: the deprecated {key}= argument is not fused (use reduction=)")
    if given.get("weight") is not None:
        raise Reject(f"{op} with per-class or per-element weights is not fused")
    params = {"reduction": given.get("reduction", "mean")}
    if op == "cosine_similarity":   # one value per row, reduced only by a mean or sum after it
        params["reduction"] = "none"
    for key, default in SETTINGS.get(op, {}).items():
        value = given.get(key, default)
        if value is not None and not isinstance(value, (bool, int, float)):
            raise Reject(f"{op}: a computed {key} is not fused")
        params[key] = value if isinstance(default, bool) or key == "ignore_index" else float(value)
    if params.get("label_smoothing") == 0.0:   # the plain cross entropy's spec, as before
        del params["label_smoothing"]
    if not 0.0 <= params.get("label_smoothing", 0.0) <= 1.0:
        raise Reject("cross_entropy's label_smoothing must be between 0 and 1")
    if params.get("reduction") not in (None, "mean", "sum", "none", "batchmean"):
        raise Reject(f"{op}: reduction {params['reduction']!r} is unknown")
    return params


def _anchor(c, name: str, op: str, tensors: list, params: dict, dim=None) -> Anchor:
    if len(tensors) != TENSORS.get(op, 2) or not all(isinstance(t, NodeRef) for t in tensors):
        raise Reject(f"{op} needs {TENSORS.get(op, 2)} tensors of the graph")
    shape, dtype = c._float_tensor(tensors[0], f"the {op} input")
    if not shape or math.prod(shape) == 0:
        raise Reject(f"{op} of an empty or 0-d tensor")
    others = [c.g.tensor(t) for t in tensors[1:]]
    if op == "cross_entropy":
        if len(shape) != 2 or others[0] != ([shape[0]], "int64"):
            raise Reject("cross_entropy is fused for [batch, classes] logits with int64 class indices "
                         f"(got {shape} and {others[0]}); probability targets and K-dim inputs stay PyTorch")
    elif op == "cosine_embedding":
        if len(shape) != 2 or others != [(shape, dtype), ([shape[0]], dtype)]:
            raise Reject("cosine_embedding_loss is fused for two [batch, features] inputs and a [batch] target")
    elif any(t != (shape, dtype) for t in others):
        raise Reject(f"{op} of tensors of different shapes or dtypes (a broadcast target) is not fused")
    if op == "cosine_similarity" and (not isinstance(dim, int) or dim % len(shape) != len(shape) - 1):
        raise Reject(f"cosine_similarity over dim {dim}, not the last dim")
    if op in ("triplet_margin",) and len(shape) < 2:
        raise Reject("triplet_margin_loss of unbatched vectors is not fused")
    if params.get("reduction") == "batchmean" and (op != "kl_div" or len(shape) != 2):
        raise Reject("reduction='batchmean' is fused for kl_div of a [batch, features] input")
    x = tensors[0]
    if op == "kl_div" and isinstance(x, NodeRef) and c.g.by_name[x.name]["op"] == "call_function" and \
            c.g.by_name[x.name]["target"] in LOG and len(c.g.users[x.name]) == 1:
        params["log_input"] = True   # kl_div(torch.log(p), q): the log is computed in the kernel
        x = c.g.args(x.name)[0][0]
        if c.g.tensor(x) != (shape, dtype):
            raise Reject("kl_div of the log of a tensor of another shape or dtype")
        return Anchor("loss", op, x, params=params, vectors=tensors[1:], covers=[tensors[0].name], out=name,
                      replaces=[name])
    return Anchor("loss", op, x, params=params, vectors=tensors[1:], out=name, replaces=[name])


def classify_call(c, name: str, fn: str | None, args: tuple, kwargs: dict) -> Anchor | None:
    if fn not in LOSS_FUNCTIONS:
        return None
    op, names = LOSS_FUNCTIONS[fn]
    given = {**dict(zip(names, args)), **kwargs}
    n = TENSORS.get(op, 2)
    tensors = [given.get(k) for k in names[:n]]
    return _anchor(c, name, op, tensors, _settings(op, given), given.get("dim", 1))


def classify_module(c, name: str, target: str, info: dict, x) -> Anchor | None:
    op = LOSS_MODULES.get(info.get("type", ""))
    if op is None:
        return None
    attrs = dict(info.get("attrs", {}))
    if "weight" in info.get("params", {}):
        attrs["weight"] = True
    args, kwargs = c.g.args(name)
    tensors = [*args, *kwargs.values()]
    return _anchor(c, name, op, tensors, _settings(op, attrs), attrs.get("dim", 1))


# -- hand-written losses: a whole-tensor mean or sum of a chain of two tensors --------------------
def _reads_two_tensors(p, ref) -> bool:
    """Whether the single-user pointwise chain ending at `ref` combines two tensors."""
    seen = 0
    while isinstance(ref, NodeRef) and seen < 32:
        s = p.sem.get(ref.name)
        if not isinstance(s, Pointwise):
            return False
        tensors = [r for r in s.inputs if isinstance(r, NodeRef) and p.g.tensor(r) is not None]
        if len(tensors) > 1:
            return True
        if not tensors or len(p.g.users[ref.name]) != 1:
            return False
        ref, seen = tensors[0], seen + 1
    return False


def patterns(p) -> None:
    """Full means and sums of a chain of two tensors (a hand-written loss) become loss totals."""
    for n in p.g.nodes:
        a = p.sem.get(n["name"])
        if isinstance(a, Anchor) and a.family == "reduction" and a.op in ("sum", "mean") and a.dim is None \
                and not a.keepdim and _reads_two_tensors(p, a.x):
            p.sem[n["name"]] = Anchor("loss", "total", a.x, params={"reduction": a.op}, out=a.out, replaces=a.replaces)


def _is_total(p, name: str) -> str | None:
    """'mean' or 'sum' when node `name` is a whole-tensor mean or sum (already a loss total or not)."""
    a = p.sem.get(name)
    if isinstance(a, Anchor) and ((a.family == "loss" and a.op == "total") or
                                  (a.family == "reduction" and a.dim is None and not a.keepdim)):
        red = a.params.get("reduction", a.op)
        return red if red in ("mean", "sum") else None
    return None


def _tail(p, start: str, dtype: str, shape: list[int]) -> tuple[list[dict], list[str], str]:
    """Operand-free pointwise steps after a loss's per-item values: (steps, nodes, last node)."""
    steps, nodes, last = [], [], start
    while (user := p._single_user(last)) is not None:
        scratch = p.builder(NodeRef(last), dtype)
        more = p._step(user, last, scratch, shape, {"view": "like", "of": "out"}, False)
        if more is None or scratch.inputs or len(scratch.args) > 1:
            break
        steps += more
        nodes += [user, *p.sem[user].covers]
        last = user
    return steps, nodes, last


def build(p, name: str, a: Anchor) -> None:
    """The loss group around anchor `a` (a Partitioner's method in all but name)."""
    shape, dtype = p.g.tensor(a.x)
    params = dict(a.params)
    rows = a.op in ("cross_entropy", "triplet_margin", "cosine_similarity", "cosine_embedding")
    full = {"view": "like", "of": "main"}
    view = {"view": "rows", "contiguous": True}
    links = p._walk_back(a.x, shape, dtype, full, True) if a.op == "total" else []
    b = p.builder(NodeRef(links[0][1]) if links else a.x, dtype)
    b.inputs.append({"arg": 0, **view})
    for ref in a.vectors:   # targets [M] (cross_entropy, cosine_embedding) or tensors like x
        b.inputs.append({"arg": b.arg(ref), **({"view": "vector"} if len(p.g.tensor(ref)[0]) == 1 and rows
                                                 else view)})
    prologue = []
    for node, running in links:
        prologue += p._step(node, running, b, shape, full, True)
        b.nodes += [node, *p.sem[node].covers]
    b.nodes += [name, *a.covers]
    if prologue:
        params["prologue"] = prologue
    last = a.out
    if params["reduction"] == "none":
        # per-row values: scalar steps after them, then a mean or sum over everything
        epi, nodes, last = _tail(p, a.out, dtype, shape[:-1]) if rows else ([], [], a.out)
        user = p._single_user(last)
        total = _is_total(p, user) if user and not (a.op == "cross_entropy") else None
        if total and user not in p.taken:
            if epi:
                params["epilogue"] = epi
            b.nodes += [*nodes, user]
            params["reduction"], last = total, user
    if params["reduction"] != "none":
        out = {"kind": "scalar"}
    elif rows:
        out = {"kind": "reduced", "dim": len(shape) - 1, "keepdim": False}
    else:
        out = {"kind": "same"}
    dims = {"M": math.prod(shape) // shape[-1], "N": shape[-1]}
    p._finish("loss", a.op, dims, params, b, out, a.replaces if last == a.out else [last])
