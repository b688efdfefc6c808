"""Attention in a captured graph: F.scaled_dot_product_attention calls, and the hand-written
form softmax((q @ k.transpose(-2, -1)) * scale [masked_fill / + mask]) [dropout(p=0)] @ v,
become one "attention" group (a flash-attention kernel; kernels.families.attention).

nn.MultiheadAttention is expanded at capture time into its projections (matmul groups) around
an F.scaled_dot_product_attention call (module.attention_capture); one kept whole (its weights
are used, dropout in training, options the kernel lacks) is refused here with the reason.
q, k, v and the mask are read in place through their strides (head-split views of a fused QKV
projection need no copies); a scale computed from sizes (1 / math.sqrt(k.size(-1))) is baked in
and guarded.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtmc.kernels.families.attention import TENSOR_MASKS, attention_spec
from mtmc.module.fx_ops import Anchor, Classifier, NodeRef, Pointwise, Reject, _arg, _cls, q

SDPA = q(F.scaled_dot_product_attention)
MASKED_FILL = q(torch.masked_fill)
MHA = _cls(nn.MultiheadAttention)
ENCODERS = {_cls(nn.TransformerEncoderLayer), _cls(nn.TransformerEncoder)}


# -- classifying ----------------------------------------------------------------------------------

def _operands(c, tensors: list, names: tuple[str, ...]) -> str:
    """The common dtype of q, k, v, after checking they are 3-D or 4-D with the same batch dims."""
    shapes = []
    for ref, what in zip(tensors, names):
        shape, dtype = c._float_tensor(ref, what)
        shapes.append((shape, dtype))
    (sq, dq), (sk, dk), (sv, dv) = shapes
    if len({dq, dk, dv}) != 1:
        raise Reject(f"attention with mixed dtypes {dq}, {dk}, {dv}")
    if len(sq) not in (3, 4) or not len(sq) == len(sk) == len(sv):
        raise Reject(f"attention on {len(sq)}-D q ({len(sk)}-D k): the kernel takes [B, L, E] or [B, H, L, E]")
    if not sq[:-2] == sk[:-2] == sv[:-2]:
        raise Reject(f"attention whose q, k, v batch dims differ ({sq[:-2]}, {sk[:-2]}, {sv[:-2]}): "
                     "broadcast or grouped-query heads are not in the kernel")
    if sk[-2] != sv[-2] or sq[-1] != sk[-1]:
        raise Reject("attention whose q, k, v sizes do not match")
    return dq


def _mask(c, mask, dtype: str, fill: bool) -> dict:
    """Spec params of a mask tensor: "add" (float), "keep" (bool, SDPA's) or "fill" (masked_fill)."""
    t = c.g.tensor(mask) if isinstance(mask, NodeRef) else None
    if t is None:
        raise Reject("an attention mask that is not a tensor of the graph")
    if t[1] == "bool":
        return {"mask": "fill" if fill else "keep"}
    if fill:
        raise Reject(f"masked_fill with a {t[1]} mask")
    if t[1] != dtype:
        raise Reject(f"an additive attention mask of dtype {t[1]} on {dtype} scores")
    return {"mask": "add"}


def _scale(c, ref, guards: list) -> float | None:
    """A scale argument: None, a number, or a node that computed one (guarded)."""
    if ref is None:
        return None
    num = c.g.number(ref)
    if num is None or not math.isfinite(num):
        raise Reject("an attention scale that is not a number")
    if isinstance(ref, NodeRef):
        guards.append((ref, num))
    return num


def classify_call(c, name: str, fn: str | None, args: tuple, kwargs: dict) -> Anchor | None:
    """An attention anchor for F.scaled_dot_product_attention, None for any other function."""
    if fn != SDPA:
        return None
    qkv = [_arg(args, kwargs, i, k) for i, k in enumerate(("query", "key", "value"))]
    mask, dropout = _arg(args, kwargs, 3, "attn_mask"), _arg(args, kwargs, 4, "dropout_p", 0.0)
    causal, scale = _arg(args, kwargs, 5, "is_causal", False), _arg(args, kwargs, 6, "scale")
    if _arg(args, kwargs, 7, "enable_gqa", False):
        raise Reject("grouped-query attention (enable_gqa=True) is not in the kernel")
    if c.g.number(dropout) != 0.0:
        raise Reject("scaled_dot_product_attention with dropout_p > 0 is random (it applies in eval mode "
                     "too); the kernel computes dropout 0 only")
    if not isinstance(causal, bool):
        raise Reject("is_causal computed at run time")
    dtype = _operands(c, qkv, ("the query", "the key", "the value"))
    guards: list = []
    params = {"mask": "causal" if causal else "none", "scale": _scale(c, scale, guards)}
    refs = list(qkv)
    if mask is not None:
        if causal:
            raise Reject("an attention mask together with is_causal=True (PyTorch refuses it too)")
        params.update(_mask(c, mask, dtype, fill=False))
        refs.append(mask)
    return Anchor("attention", "sdpa", qkv[0], params={**params, "_guards": guards}, vectors=refs[1:],
                  out=name, replaces=[name])


def classify_module(c, name: str, target: str, info: dict, x) -> Anchor | None:
    """nn.MultiheadAttention (or a Transformer encoder layer / encoder) kept whole by the
    capture: always a Reject with the reason."""
    if info.get("type") in ENCODERS:
        return _encoder_reject(c, name, info)
    if info.get("type") != MHA:
        return None
    attrs = info.get("attrs", {})
    if attrs.get("dropout") and attrs.get("training", True):
        raise Reject(f"nn.MultiheadAttention with dropout={attrs['dropout']} in training mode is random")
    if attrs.get("add_zero_attn") or "bias_k" in info.get("params", {}):
        raise Reject("nn.MultiheadAttention with add_bias_kv or add_zero_attn is not in the kernel")
    raise Reject("nn.MultiheadAttention whose attention weights are used (need_weights), with a key padding "
                 "or attention mask, or unbatched input, stays PyTorch")


def _encoder_reject(c, name: str, info: dict):
    kind = info["type"].rsplit(".", 1)[-1]
    if info.get("attrs", {}).get("training", True):
        raise Reject(f"nn.{kind} in training mode with dropout > 0 is random, or it gets masks or unbatched "
                     "input: it stays PyTorch (eval mode or dropout=0 makes it kernels)")
    raise Reject(f"nn.{kind} with masks, unbatched input or a custom layer stays PyTorch")


# -- the hand-written pattern ------------------------------------------------------------------------

def _only_user(p, name: str) -> str | None:
    users = p.g.users[name]
    return users[0] if len(users) == 1 else None


def _masked_fill(p, name: str):
    """(input, mask, value) of a masked_fill node, else None."""
    n = p.g.by_name[name]
    if not ((n["op"] == "call_method" and n["target"] == "masked_fill")
            or (n["op"] == "call_function" and n["target"] == MASKED_FILL)):
        return None
    args, kwargs = p.g.args(name)
    return _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "mask"), _arg(args, kwargs, 2, "value")


def _match(p, name: str) -> Anchor | None:
    """When `name` is the softmax of a hand-written attention, its anchor (at the P @ v matmul)."""
    sm = p.sem.get(name)
    if not (isinstance(sm, Anchor) and sm.family == "softmax" and sm.op == "softmax"):
        return None
    # forward: no-ops (dropout p=0, eval-mode dropout, contiguous), then P @ v
    cur, covers = name, [name]
    while True:
        user = _only_user(p, cur)
        s = p.sem.get(user) if user else None
        if isinstance(s, Pointwise) and s.binop is None and not s.steps and s.inputs[0] == NodeRef(cur):
            cur = user
            covers.append(user)
            continue
        break
    pv = p.sem.get(user) if user else None
    if not (isinstance(pv, Anchor) and pv.family == "matmul" and pv.op == "bmm" and pv.x == NodeRef(cur)
            and not pv.b_nk and pv.bias is None and isinstance(pv.b, NodeRef)):
        return None
    # backward from the softmax input: scalar scales, one mask (masked_fill or + tensor), q @ k^T
    scale, fill, mask, kind, guards = 1.0, None, None, "none", []
    cur = sm.x.name
    while True:
        if _only_user(p, cur) is None:
            return None
        s, mf = p.sem.get(cur), _masked_fill(p, cur)
        if mf is not None and mask is None and isinstance(mf[0], NodeRef):
            value = p.g.number(mf[2])
            if value is None or isinstance(mf[2], NodeRef) or p.g.tensor(mf[1]) is None:
                return None
            mask, kind, fill = mf[1], "fill", value * scale   # the scales applied after it scale the fill
            covers.append(cur)
            cur = mf[0].name
        elif (scaled := _scalar_factor(p, cur, guards)) is not None:
            running, factor = scaled
            scale *= factor
            covers.append(cur)
            cur = running.name
        elif isinstance(s, Pointwise) and s.binop == "add" and mask is None:
            if scale != 1.0:   # (qk + mask) * c scales the mask too: not SDPA's form
                return None
            x, y = s.inputs
            if not all(isinstance(r, NodeRef) and p.g.tensor(r) is not None for r in (x, y)):
                return None
            # the logits are the operand computed by the chain (a matmul, a scale, a fill)
            computed = [r for r in (x, y) if isinstance(p.sem.get(r.name), (Anchor, Pointwise))
                        or _masked_fill(p, r.name)]
            running = computed[0] if computed else x
            mask, kind = (y if running == x else x), "add"
            covers.append(cur)
            cur = running.name
        else:
            break
    qk = p.sem.get(cur)
    if not (isinstance(qk, Anchor) and qk.family == "matmul" and qk.op == "bmm" and qk.b_nk and qk.bias is None
            and isinstance(qk.b, NodeRef)):
        return None
    covers = [cur, *qk.covers, *covers]
    q = qk.x
    while _only_user(p, q.name) and (scaled := _scalar_factor(p, q.name, guards)) is not None:
        covers.append(q.name)   # (q * s) @ k^T: the scale folds into the logits' too
        q, factor = scaled
        scale *= factor
    params = {"mask": kind, "scale": scale, "_guards": guards}
    refs = [qk.b, pv.b]
    if mask is not None:
        refs.append(mask)
        if kind == "fill":
            if p.g.tensor(mask)[1] != "bool":
                return None
            params["fill"] = fill
    return Anchor("attention", "sdpa", q, params=params, vectors=refs, covers=covers, out=user, replaces=[user])


def _scalar_factor(p, name: str, guards: list) -> tuple[NodeRef, float] | None:
    """(x, c) when node `name` is x * c or x / c for a number c (a node computing c is guarded)."""
    s = p.sem.get(name)
    if not (isinstance(s, Pointwise) and s.binop in ("mul", "div")):
        return None
    x, y = s.inputs
    running, other = (x, y) if isinstance(x, NodeRef) and p.g.tensor(x) is not None else (y, x)
    num = p.g.number(other)
    if not isinstance(running, NodeRef) or num is None or num == 0 or (s.binop == "div" and running != x):
        return None
    if isinstance(other, NodeRef):
        guards.append((other, num))
    return running, num if s.binop == "mul" else 1.0 / num


def patterns(p) -> None:
    """Hand-written attentions become attention anchors (their matmuls and softmax taken in)."""
    for n in p.g.nodes:
        found = _match(p, n["name"])
        if found:
            p.sem[found.out] = found
            for c in found.covers:
                p.sem.pop(c, None)


# -- building the group -----------------------------------------------------------------------------

def build(p, name: str, a: Anchor, builder=None) -> None:
    """The attention group around anchor `a` (a Partitioner's method in all but name; `builder`
    its group builder class, or None where the partitioner makes builders, p.builder)."""
    refs = [a.x, *a.vectors]
    try:
        dtype = _operands(Classifier(p.g), refs[:3], ("the query", "the key", "the value"))
    except Reject as e:
        p.why[name] = str(e)
        return
    params = dict(a.params)
    guards = params.pop("_guards", [])
    shapes = [p.g.tensor(r)[0] for r in refs]
    mask = params.pop("mask")
    try:
        spec = attention_spec(*shapes[:3], dtype=dtype, mask=mask,
                              mask_shape=shapes[3] if mask in TENSOR_MASKS else None, **params)
    except ValueError as e:
        p.why[name] = str(e)
        return
    if mask == "add" and p.g.tensor(refs[3])[1] != dtype:
        p.why[name] = "the additive mask's dtype differs from q's"
        return
    b = builder(p.g, a.x, dtype) if builder else p.builder(a.x, dtype)
    b.inputs += [{"arg": b.arg(r), "view": "as_is"} for r in refs]   # read in place, through strides
    for ref, value in guards:
        b.guard(ref, value)
    b.nodes += [name, *a.covers]
    out = {"kind": "attention"}
    perm = _user_permutation(p, a.replaces[0], len(shapes[0]))
    if perm:
        out["perm"] = perm
    p._finish("attention", "sdpa", spec.dims, spec.params, b, out, a.replaces)


def _user_permutation(p, name: str, rank: int) -> list[int] | None:
    """The dims order of the one transpose / permute reading `name` (the heads merged back:
    y.transpose(1, 2).contiguous().view(B, T, C)); the kernel then writes its output in that
    order, so the permuted view is already contiguous and .contiguous() copies nothing."""
    users = p.g.users[name]
    if len(users) != 1:
        return None
    n = p.g.by_name[users[0]]
    args, _ = p.g.args(users[0])
    if not args or args[0] != NodeRef(name) or n["op"] not in ("call_method", "call_function"):
        return None
    what = n["target"].rsplit(".", 1)[-1]
    dims = list(args[1:])
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = list(dims[0])
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return None
    if what == "transpose" and len(dims) == 2:
        perm = list(range(rank))
        i, j = dims[0] % rank, dims[1] % rank
        perm[i], perm[j] = perm[j], perm[i]
    elif what == "permute" and len(dims) == rank:
        perm = [d % rank for d in dims]
    else:
        return None
    return perm if sorted(perm) == list(range(rank)) and perm != list(range(rank)) else None


def out_lines(out: dict, alloc: str) -> list[str]:
    """Wrapper lines making an attention group's `shape` and `out` (q's shape with v's last dim;
    stored in the order of out["perm"] when the group's user permutes it)."""
    lines = ["shape = (*k0.shape[:-1], k2.shape[-1])"]
    perm = out.get("perm")
    if not perm:
        return lines + [f"out = torch.empty(shape, {alloc})"]
    inverse = [perm.index(i) for i in range(len(perm))]
    return lines + [f"out = torch.empty([shape[i] for i in {perm}], {alloc}).permute({', '.join(map(str, inverse))})"
                    "  # stored as its user reads it"]
