"""An eval-mode BatchNorm folded into the conv or linear map before it, at run time.

    bn(conv(x, W, b))  ->  conv(x, W * s, (b - mean) * s + beta),   s = gamma / sqrt(var + eps)

for nn.BatchNorm1d/2d/3d modules in eval mode and F.batch_norm(..., training=False) calls

with s computed in ModelNew.forward from the live parameters and running statistics on every
call (so ModelNew takes Model's state_dict and follows updates), and an assertion that the
BatchNorm is still in eval mode (module.train() afterwards would make the fold wrong).  Refused:
a BatchNorm in training mode, or without running statistics ("training-mode BatchNorm uses batch
statistics": KernelBench builds its models in training mode, so there it is always refused), a
map whose output is read elsewhere too, a BatchNorm1d over a 3-d linear output (its channels are
not the features), fp16 / bf16 weights.
"""
from __future__ import annotations

import operator

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtmc.module.fx_ops import Graph, NodeRef, _arg, _cls, q
from mtmc.module.graph_stage.common import EXACT_DTYPES, feeding_map
from mtmc.module.graph_stage.edit import Editor, numel, readers
from mtmc.module.graph_stage.records import Candidate, Work

RULE = "fold_batchnorm"
BATCH_NORMS = {_cls(c) for c in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)}
MUL, ADD, SUB = q(operator.mul), q(operator.add), q(operator.sub)
CONV_FN = {"conv1d": F.conv1d, "conv2d": F.conv2d, "conv3d": F.conv3d, "conv_transpose1d": F.conv_transpose1d,
           "conv_transpose2d": F.conv_transpose2d, "conv_transpose3d": F.conv_transpose3d}


def _tup(v):
    return tuple(v) if isinstance(v, (list, tuple)) else v


def candidates(desc: dict) -> list[Candidate]:
    g = Graph(desc)
    out = []
    for n in g.nodes:
        bn = _batch_norm(g, n["name"])
        if bn is not None:
            c = _candidate(desc, g, n["name"], bn)
            if c is not None:
                out.append(c)
    return out


def _batch_norm(g: Graph, name: str) -> dict | None:
    """{x, training, tracked, eps, refs (running_mean, running_var, weight, bias: a NodeRef, a
    parameter path or None), module} of a BatchNorm call, None for anything else."""
    n = g.by_name[name]
    args, kwargs = g.args(name) if n["op"].startswith("call_") else ((), {})
    if n["op"] == "call_module" and g.modules.get(n["target"], {}).get("type") in BATCH_NORMS:
        target = n["target"]
        info = g.modules[target]
        attrs, params = info.get("attrs", {}), info.get("params", {})
        refs = {k: f"{target}.{k}" if k in params else None for k in ("running_mean", "running_var", "weight", "bias")}
        return {"x": args[0] if args else None, "training": attrs.get("training", True),
                "tracked": attrs.get("track_running_stats", True) and "running_mean" in params,
                "eps": attrs.get("eps", 1e-5), "refs": refs, "module": target}
    if n["op"] == "call_function" and n["target"] == q(F.batch_norm):
        refs = {k: _arg(args, kwargs, i, k) for i, k in ((1, "running_mean"), (2, "running_var"), (3, "weight"),
                                                         (4, "bias"))}
        training = _arg(args, kwargs, 5, "training", False)
        return {"x": args[0] if args else None, "training": training,
                "tracked": isinstance(refs["running_mean"], NodeRef) and isinstance(refs["running_var"], NodeRef),
                "eps": _arg(args, kwargs, 7, "eps", 1e-5), "refs": refs, "module": None}
    return None


def _candidate(desc: dict, g: Graph, name: str, bn: dict) -> Candidate | None:
    x = bn["x"]
    m, walked = feeding_map(g, x) if isinstance(x, NodeRef) else (None, [])
    if m is None:
        return None
    ops = [g.words(m.node), *(g.words(w) for w in walked), g.words(name)]
    refuse = lambda why: Candidate(RULE, name, g.path, False, why, ops=ops)   # noqa: E731
    if bn["training"] is not False:
        return refuse("training-mode BatchNorm uses batch statistics (the mean and variance of each batch, "
                      "and it updates its running statistics): it cannot be folded into fixed weights; only a "
                      "BatchNorm in eval mode (module.eval(), or F.batch_norm with training=False) folds")
    if not bn["tracked"]:
        return refuse("a BatchNorm without running statistics normalizes with batch statistics even in eval mode")
    if not isinstance(bn["eps"], (int, float)) or any(
            v is not None and not isinstance(v, (NodeRef, str)) for v in bn["refs"].values()):
        return refuse("a BatchNorm whose eps or statistics are not plain tensors")
    if walked:
        return refuse(f"{', '.join(g.words(w) for w in walked)} lies between {g.words(m.node)} and the BatchNorm: "
                      "only a BatchNorm reading the map's output directly is folded")
    if m.dtype not in EXACT_DTYPES:
        return refuse(f"dtype {m.dtype}: the folded weights would be rounded to {m.dtype}")
    if g.users[m.node] != [name]:
        return refuse(f"{g.words(m.node)} is also read elsewhere: its unnormalized output is still needed")
    if m.conv is None and len(m.out_shape) != 2:
        return refuse(f"a BatchNorm1d over a {len(m.out_shape)}-d linear output normalizes dim 1, not the "
                      "linear map's features")
    if m.conv is not None and (m.conv.get("padding_mode") or "zeros") != "zeros":
        return refuse(f"padding_mode {m.conv.get('padding_mode')!r}: only zero padding is rebuilt as F.{m.kind}")
    ed, launches = _apply(desc, g, name, bn, m)
    out_bytes = 4.0 * numel(m.out_shape)
    before = Work(4.0 * numel(m.out_shape), 2 * out_bytes, 1)
    after = Work(2.0 * numel(m.weight_shape), 8.0 * numel(m.weight_shape), launches)
    return Candidate(RULE, name, g.path, True,
                     f"exact: {g.words(name)} is in eval mode, so it is a fixed per-channel scale and shift "
                     f"of {g.words(m.node)}'s output, which folds into its weights and bias; they are computed "
                     "from the live parameters and running statistics on every call"
                     + (", and ModelNew asserts the BatchNorm is still in eval mode" if bn["module"] else ""),
                     ops=ops, result=f"{m.kind} with folded weights", before=before, after=after, dtype=m.dtype,
                     apply=ed.desc)


def _apply(desc, g: Graph, name: str, bn: dict, m) -> tuple[Editor, int]:
    ed = Editor(desc)
    had = readers(desc)
    dt, c = m.dtype, m.n

    def p(k):
        ref = bn["refs"][k]
        return ref if isinstance(ref, NodeRef) else ed.param(name, ref, [c], dt)

    if bn["module"]:   # ModelNew refuses to run the fold once the BatchNorm is put back in training mode
        target = bn["module"]
        flag = ed.add(name, "bn_training", "get_attr", f"{target}.training", (), {}, None, dt, scalar=False)
        ok = ed.add(name, "bn_eval", "call_function", q(operator.not_), (flag,), {}, None, dt, scalar=True)
        ed.add(name, "bn_assert", "call_function", q(torch._assert),
               (ok, f"ModelNew folded {target} in eval mode into the weights; call eval() on it"), {}, None, dt,
               scalar=None)
    var_eps = ed.add(name, "var_eps", "call_function", ADD, (p("running_var"), float(bn["eps"])), {}, [c], dt)
    s = ed.add(name, "bn_scale", "call_function", q(torch.rsqrt), (var_eps,), {}, [c], dt)
    if bn["refs"]["weight"] is not None:
        s = ed.add(name, "bn_scale", "call_function", MUL, (s, p("weight")), {}, [c], dt)
    w = m.weight if isinstance(m.weight, NodeRef) else ed.param(name, m.weight["attr"], m.weight_shape, dt)
    view = [1] * len(m.weight_shape)
    view[1 if m.conv is not None and "transpose" in m.kind else 0] = c
    sv = ed.add(name, "bn_scale_w", "call_method", "reshape", (s, tuple(view)), {}, view, dt)
    w2 = ed.add(name, "w_folded", "call_function", MUL, (w, sv), {}, m.weight_shape, dt)
    shift = ed.add(name, "bn_mean", "call_function", operator_neg(), (p("running_mean"),), {}, [c], dt)
    if m.bias is not None:
        b = m.bias if isinstance(m.bias, NodeRef) else ed.param(name, m.bias["attr"], [c], dt)
        shift = ed.add(name, "b_minus_mean", "call_function", SUB, (b, p("running_mean")), {}, [c], dt)
    b2 = ed.add(name, "b_folded", "call_function", MUL, (shift, s), {}, [c], dt)
    if bn["refs"]["bias"] is not None:
        b2 = ed.add(name, "b_folded", "call_function", ADD, (b2, p("bias")), {}, [c], dt)
    if m.conv is None:
        new = ed.add(name, "linear_folded", "call_function", q(F.linear), (m.x, w2, b2), {}, m.out_shape, dt)
    else:
        cv = m.conv
        kw = {"stride": _tup(cv.get("stride", 1)), "padding": _tup(cv.get("padding", 0)),
              "dilation": _tup(cv.get("dilation", 1)), "groups": cv.get("groups", 1) or 1}
        if "transpose" in m.kind:
            kw["output_padding"] = _tup(cv.get("output_padding", 0))
        new = ed.add(name, "conv_folded", "call_function", q(CONV_FN[m.kind]), (m.x, w2, b2), kw, m.out_shape, dt)
    ed.replace_uses(name, new)
    ed.drop_dead(had | {name, m.node}, {name, m.node})
    return ed, 3   # the scale's and the shift's [C] chains fuse; the weight scaling is one more kernel


def operator_neg() -> str:
    return q(operator.neg)
