"""Channels-last around a conv left to cuDNN (regroup's library conv and its pointwise tail).

Measured on the H100 (bench/results/2026-12-06-conv-layout-h100.json): cuDNN runs every 2-D and
3-D conv of the level-2 dev set 1.1-2.8x faster in channels-last than as given (NCHW), including
the input's conversion, but converting its output back to NCHW for the tail costs more than that.
So the island keeps the output channels-last to the end:

  xc = x.contiguous(memory_format=channels_last)   # one pass over the input
  y  = conv(xc)                                     # cuDNN's channels-last kernel; y is NCHW-shaped
  t  = y.permute(0, 2, 3, 1)                        # [N, H, W, C], contiguous: a view, no copy
  ... the pointwise tail on t, per-channel operands read as [C] vectors (a row-wise fused group)
  out = t.permute(0, 3, 1, 2)                       # NCHW-shaped, channels-last strides: a view

Legal only where the tail is pointwise (its other operands numbers, per-channel tensors or single
values) or a softmax over the channels (a row softmax channels-last), and its result is a graph
output: a later group of ours reads its input contiguous, so it would copy the tensor back, and
the conversion would not pay.  The result has Model's shape and
values in channels-last strides.
"""
from __future__ import annotations

import torch

from mtmc.module.fx_ops import Anchor, Graph, NodeRef, Pointwise
from mtmc.module.graph_stage.common import CONV_FUNCTIONS, CONV_MODULES, classify, per_feature
from mtmc.module.graph_stage.edit import Editor, encode, numel, tensor_value
from mtmc.module.graph_stage.records import Candidate

RULE = "channels_last"
MARGIN = 0.95          # channels-last (with the input's conversion) must be at least 5 % faster
ERROR_SLACK = 4.0      # ... and its error against float64 within this factor of the error as given
MEASURED = "bench/results/2026-12-06-conv-layout-h100.json"
FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def judge(measured: dict) -> tuple[bool, str]:
    """Whether a measured island pays (tools.layout_probe's numbers), and why in words: it must be
    faster and as exact as cuDNN as given.  cuDNN picks TF32 or fp32 arithmetic per shape and
    layout; on the H100, 13 of 33 level-2 dev convs ran fp32 as given and TF32 channels-last,
    which the guard's fp32 tolerance refuses (the as-given error sets that tolerance)."""
    if "error" in measured:
        return False, f"not measured: {measured['error']}"
    nchw, cl, e0, e1 = measured["nchw_ms"], measured["cl_ms"], measured["nchw_err"], measured["cl_err"]
    numbers = (f"as given {nchw:.3f} ms (error {e0:.1e} of the largest value), channels-last with the "
               f"input's conversion {cl:.3f} ms (error {e1:.1e}), measured on {measured.get('gpu', 'this GPU')}")
    if e1 > ERROR_SLACK * e0 + 1e-6:
        return False, f"cuDNN rounds this conv to TF32 channels-last but not as given: {numbers}"
    if not cl < MARGIN * nchw:
        return False, f"cuDNN is not faster channels-last here: {numbers}"
    return True, f"cuDNN runs this conv {nchw / cl:.2f}x faster channels-last at the same precision: {numbers}"


def conv_of(desc: dict, nodes: list[str]) -> str | None:
    """The first of `nodes` that is a 2-D or 3-D (transposed) conv, or None."""
    g = Graph(desc)
    return next((n for n in nodes if _rank(g, n)), None)


def _rank(g: Graph, name: str) -> int | None:
    """The tensor rank (4 or 5) of a 2-D or 3-D (transposed) conv node, else None."""
    n = g.by_name[name]
    if n["op"] == "call_module":
        conv = CONV_MODULES.get(g.modules.get(n["target"], {}).get("type", ""))
    else:
        conv = CONV_FUNCTIONS.get(n["target"]) if n["op"] == "call_function" else None
    return conv[1] + 2 if conv and conv[1] in (2, 3) else None


def _channel_softmax(g: Graph, name: str, shape, dtype) -> bool:
    """A softmax or log-softmax over the channel dim (dim 1): channels-last, a row-wise one."""
    a = classify(g, name)
    return isinstance(a, Anchor) and a.family == "softmax" and a.dim == 1 and g.tensor(name) == (shape, dtype)


def _tail(g: Graph, conv: str, shape, dtype) -> tuple[list[str], list[str]]:
    """The pointwise nodes of the conv's shape reachable from it through pointwise nodes (a chain,
    or a formula reading a value twice: x * clamp((x + 3) / 6, 0, 1)) and softmaxes over the
    channels, in graph order, and the nodes outside them that read the conv or one of them."""
    region, todo, outside = set(), [conv], []
    while todo:
        for u in g.users[todo.pop()]:
            if u in region or u in outside or g.layout_free_reader(u):   # x.device: the same channels-last
                continue
            if (isinstance(classify(g, u), Pointwise) or _channel_softmax(g, u, shape, dtype)) \
                    and g.tensor(u) == (shape, dtype):
                region.add(u)
                todo.append(u)
            else:
                outside.append(u)
    return sorted(region, key=g.order.get), outside


def channels_last(desc: dict, conv: str) -> Candidate:
    """The island around conv node `conv`, or a refusal with the reason."""
    g = Graph(desc)
    words = g.words(conv)
    refuse = lambda why: Candidate(RULE, conv, g.path, False, why, ops=[words])  # noqa: E731
    rank, t = _rank(g, conv), g.tensor(conv)
    if rank is None or t is None or len(t[0]) != rank:
        return refuse(f"{words} is not a 2-D or 3-D convolution")
    shape, dtype = t
    args, kwargs = g.args(conv)
    x = args[0] if args else None
    if not isinstance(x, NodeRef) or g.tensor(x) is None or len(g.tensor(x)[0]) != rank:
        return refuse(f"{words}: its input is not a {rank}-d tensor of the graph")
    tail, outside = _tail(g, conv, shape, dtype)
    if not tail:
        return refuse(f"no pointwise op follows {words}: nothing would read it channels-last")
    inside = {conv, *tail}
    leaves = lambda n: [u for u in g.users[n] if u not in inside and not g.layout_free_reader(u)]  # noqa: E731
    sinks = [n for n in tail if leaves(n)]
    if leaves(conv) or len(sinks) != 1:
        return refuse(f"{words}'s value leaves its pointwise tail more than once: the tail must end in one result")
    cur = sinks[0]
    if set(leaves(cur)) != {"output"}:
        return refuse(f"the tail's result feeds {', '.join(g.words(u) for u in g.users[cur])}: a later "
                      "group reads it contiguous, which would copy it back to NCHW")
    operands = []
    for name in tail:
        a, k = g.args(name)
        for r in [*a, *k.values()]:
            if not isinstance(r, NodeRef) or r.name in inside or g.tensor(r) is None:
                continue
            if numel(g.tensor(r)[0]) == 1:
                continue
            if not per_feature(g, r, shape, 1):
                return refuse(f"{g.words(name)} reads {g.words(r.name)}, a tensor that is not per-channel")
            operands.append((name, r.name))
    perm = (0, *range(2, rank), 1)
    back = (0, rank - 1, *range(1, rank - 1))
    nhwc = [shape[p] for p in perm]
    ed = Editor(desc)
    xt = g.tensor(x)
    xc = ed.add(conv, "channels_last", "call_method", "contiguous", (x,), {"memory_format": FORMATS[rank]},
                xt[0], xt[1])
    ed.replace_in(conv, x.name, xc)
    first = tail[0]
    view = ed.add(first, "nhwc", "call_method", "permute", (NodeRef(conv), *perm), {}, nhwc, dtype)
    for name in g.users[conv]:
        ed.replace_in(name, conv, view)
    vectors: dict[str, NodeRef] = {}
    for name, r in operands:   # [C, 1, 1] / [1, C, 1, 1] operands as [C] along the last dim, made at first use
        if r not in vectors:
            vectors[r] = ed.add(name, f"{r}_c", "call_method", "reshape", (NodeRef(r), shape[1]), {},
                                [shape[1]], g.tensor(r)[1])
        ed.replace_in(name, r, vectors[r])
    for name in tail:
        ed.node(name)["value"] = tensor_value(nhwc, dtype)
        a = classify(g, name)
        if isinstance(a, Anchor):   # a channel softmax: over the last dim of [N, *spatial, C]
            fn = "torch.softmax" if a.op == "softmax" else "torch.log_softmax"
            x_now = view if a.x.name == conv else a.x
            ed.node(name).update(op="call_function", target=fn, args=encode((x_now, rank - 1)), kwargs=encode({}))
    out = ed.add("output", "nchw", "call_method", "permute", (NodeRef(cur), *back), {}, shape, dtype)
    ed.replace_in("output", cur, out)
    ops = [words, *(g.words(n) for n in tail)]
    return Candidate(RULE, conv, g.path, True,
                     f"cuDNN runs this {rank - 2}-D conv faster channels-last (measured on the level-2 dev set's "
                     f"convs, {MEASURED}); its pointwise tail reads it in that layout and the result is a graph "
                     "output, so nothing converts it back", ops=ops,
                     result="the conv on a channels-last copy of its input, the tail over [N, *spatial, C] with "
                            "per-channel operands as [C] vectors, the result in channels-last strides",
                     dtype=dtype, apply=ed.desc)
