"""A sum or mean over a convolution's positions, moved before it (reduction_before_linear's case
for spatial dims: KernelBench L2 13's mean over the depth of a 3-D transposed conv, the global
average pools after a transposed conv).

Along one spatial dim, output o of a conv reads input i = o * stride + k * dilation - pad through
tap k; input i of a transposed conv writes output o = i * stride + k * dilation - pad.  Either way
the sum over the outputs is

    sum_o y[o] = sum_k sum_i A[k, i] x[i] w[k]  (+ bias times the number of outputs)

with A[k, i] = 1 where input i meets tap k at an output inside the result: the borders, the
padding, the strides and the output padding all live in the 0/1 matrix A.  A is separable over
dims, so the window sums X'[k] = sum_i A[k, i] x[i] are one einsum of x with one small matrix per
reduced dim; what is left is a conv over the kept dims whose input channels are (channel, reduced
tap), or, when every position is reduced, one [N, C_in * taps] x [C_in * taps, C_out] product.
Exact in real arithmetic; the per-channel affine ops between the conv and the reduction commute
with a mean over positions (their constants are the same at every position), and a sum is that
mean times the number of positions.  A is built from the recorded sizes, so ModelNew runs
Model's own forward on inputs of other shapes (assemble.shape_guard).
"""
from __future__ import annotations

import math
import string

import torch
import torch.nn.functional as F

from mtmc.module.fx_ops import Graph, NodeRef, q
from mtmc.module.graph_stage.common import LinearMap, Reduction, Step
from mtmc.module.graph_stage.edit import Editor, numel, readers
from mtmc.module.graph_stage.records import Candidate, Work

MAX_WINDOW_ENTRIES = 8192   # taps x input size of one dim's 0/1 matrix (a literal in ModelNew's source)
MUL, ADD = "_operator.mul", "_operator.add"
CONV_FN = {"conv1d": F.conv1d, "conv2d": F.conv2d, "conv3d": F.conv3d}
CONVT_FN = {"conv_transpose1d": F.conv_transpose1d, "conv_transpose2d": F.conv_transpose2d,
            "conv_transpose3d": F.conv_transpose3d}


def _per_dim(v, r: int) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v] * r


def geometry(m: LinearMap, xs: list[int]) -> list[dict] | str:
    """Per spatial dim: input size, taps, stride, dilation, the pad before, output size; or why
    the conv's geometry is not taken."""
    c = m.conv or {}
    r = len(m.out_shape) - 2
    ks = m.weight_shape[2:]
    stride, dil = _per_dim(c.get("stride") or 1, r), _per_dim(c.get("dilation") or 1, r)
    pad = c.get("padding") or 0
    if isinstance(pad, str):
        if pad == "valid":
            pad = 0
        elif pad == "same":   # stride 1; torch puts the odd one at the end
            pad = [d * (k - 1) // 2 for d, k in zip(dil, ks)]
        else:
            return f"padding {pad!r}"
    pad = _per_dim(pad, r)
    if not all(isinstance(v, int) for v in [*stride, *dil, *pad]):
        return "a stride, padding or dilation computed at run time"
    return [{"H": xs[2 + j], "K": ks[j], "s": stride[j], "d": dil[j], "p": pad[j], "O": m.out_shape[2 + j]}
            for j in range(r)]


def windows(dim: dict, transposed: bool) -> list[list[int]]:
    """A[k][i]: 1 where input i meets tap k at an output in [0, O) along this dim."""
    H, K, s, d, p, O = dim["H"], dim["K"], dim["s"], dim["d"], dim["p"], dim["O"]
    rows = []
    for k in range(K):
        if transposed:
            rows.append([int(0 <= i * s + k * d - p < O) for i in range(H)])
        else:   # i = o * s + k * d - p for an o in [0, O)
            rows.append([int((i + p - k * d) % s == 0 and 0 <= (i + p - k * d) // s < O) for i in range(H)])
    return rows


def positions_refusal(m: LinearMap, r: Reduction, xs: list[int]) -> str | None:
    """Why this reduction over a conv's positions is not moved before it (None: it may be)."""
    c = m.conv or {}
    nd = len(m.out_shape)
    if len(m.weight_shape) != nd or len(xs) != nd:   # [C, *spatial] without a batch dim
        return "an unbatched conv input (no batch dim)"
    if not r.dims or any(d < 2 for d in r.dims):
        return (f"the {r.op} runs over dims {r.dims}, positions and the batch or channels together: only "
                "reductions over positions alone, or over the output channels alone, are moved before a conv")
    if c.get("groups", 1) != 1:
        return f"a grouped conv (groups={c.get('groups')}): each output channel sees only its group's inputs"
    if c.get("padding_mode", "zeros") != "zeros":
        return f"padding_mode {c.get('padding_mode')!r}: the padded values depend on the input"
    geo = geometry(m, xs)
    if isinstance(geo, str):
        return geo
    big = [j for j in r.dims if geo[j - 2]["K"] * geo[j - 2]["H"] > MAX_WINDOW_ENTRIES]
    if big:
        return (f"dim {big[0]}'s tap-window matrix ({geo[big[0] - 2]['K']} taps x {geo[big[0] - 2]['H']} inputs) "
                f"is past {MAX_WINDOW_ENTRIES} entries")
    return None


def positions_work(m: LinearMap, r: Reduction, xs: list[int]) -> Work:
    """The moved form's work: the window sums (one read of x) and the small conv or GEMM."""
    taps = math.prod(m.weight_shape[j] for j in r.dims)
    kept_k = math.prod(m.weight_shape[j] for j in range(2, len(m.weight_shape)) if j not in r.dims)
    cin = xs[1]
    red_in = math.prod(xs[j] for j in r.dims)
    sums = numel(xs) // red_in * taps
    outs = numel(m.out_shape) // math.prod(m.out_shape[j] for j in r.dims)   # [N, C_out, kept]
    rows = outs // m.n
    if "transpose" in m.kind:   # every input position of the kept dims meets every tap
        rows = sums // (cin * taps)
    gemm = Work(2.0 * rows * m.n * cin * taps * kept_k, 4.0 * (sums + outs + numel(m.weight_shape)), 1)
    return Work(2.0 * numel(xs) * taps, 4.0 * (numel(xs) + sums), 1) + gemm + Work(0.0, 4.0 * 2 * outs, 2)


def positions_rewrite(desc: dict, g: Graph, m: LinearMap, r: Reduction, steps: list[Step], clone) -> tuple[Editor, str]:
    """The edited graph (see the module's doc) and its result in words.  `clone(ed, g, before,
    node, old, new, shape, dtype)` copies a chain step onto the reduced value."""
    ed = Editor(desc)
    had = readers(desc)
    at = r.node
    xs = g.tensor(m.x)[0]
    nd = len(m.out_shape)
    geo = geometry(m, xs)
    transposed = "transpose" in m.kind
    red = list(r.dims)
    kept = [j for j in range(2, nd) if j not in red]
    letters = iter(string.ascii_lowercase)
    n_, c_ = next(letters), next(letters)
    pos = {j: next(letters) for j in range(2, nd)}
    tap = {j: next(letters) for j in red}
    mats = []
    for j in red:
        a = windows(geo[j - 2], transposed)
        mats.append(ed.add(at, "tap_windows", "call_method", "new_tensor", (m.x, a), {}, [len(a), len(a[0])],
                           m.dtype))
    taps_out = "".join(tap[j] for j in red)
    eq = ",".join(tap[j] + pos[j] for j in red) + "," + n_ + c_ + "".join(pos.values()) \
        + "->" + n_ + c_ + taps_out + "".join(pos[j] for j in kept)
    t_shape = [xs[0], xs[1], *(geo[j - 2]["K"] for j in red), *(xs[j] for j in kept)]
    sums = ed.add(at, "window_sums", "call_function", q(torch.einsum), (eq, *mats, m.x), {}, t_shape, m.dtype)
    w = m.weight if isinstance(m.weight, NodeRef) else ed.param(at, m.weight["attr"], m.weight_shape, m.dtype)
    cin, taps = xs[1], math.prod(geo[j - 2]["K"] for j in red)
    keep_shape = [1 if j in red else s for j, s in enumerate(m.out_shape)]
    if not kept:   # every position: one product over (channel, tap)
        weq = n_ + c_ + taps_out + "," + ("o" + c_ if not transposed else c_ + "o") + taps_out + "->" + n_ + "o"
        y = ed.add(at, "conv_as_gemm", "call_function", q(torch.einsum), (weq, sums, w), {},
                   [m.out_shape[0], m.n], m.dtype)
        result = f"window sums of the input ({eq}) times the weights: one [N, {cin * taps}] x [{cin * taps}, {m.n}] product"
    else:
        flat = ed.add(at, "window_sums_flat", "call_method", "reshape",
                      (sums, (-1, cin * taps, *(xs[j] for j in kept))), {},
                      [xs[0], cin * taps, *(xs[j] for j in kept)], m.dtype)
        kk = [m.weight_shape[j] for j in kept]
        if transposed:   # [C_in, C_out, k...] -> [C_in * reduced taps, C_out, kept k]
            perm = (0, *red, 1, *kept)
            w_shape = [cin * taps, m.n, *kk]
        else:            # [C_out, C_in, k...] -> [C_out, C_in * reduced taps, kept k]
            perm = (0, 1, *red, *kept)
            w_shape = [m.n, cin * taps, *kk]
        wp = ed.add(at, "w_taps", "call_method", "permute", (w, perm), {},
                    [m.weight_shape[i] for i in perm], m.dtype)
        w2 = ed.add(at, "w_taps", "call_method", "reshape", (wp, tuple(w_shape)), {}, w_shape, m.dtype)
        kd = [geo[j - 2] for j in kept]
        kw = {"stride": tuple(d["s"] for d in kd), "padding": tuple(d["p"] for d in kd),
              "dilation": tuple(d["d"] for d in kd)}
        if transposed:
            outp = _per_dim((m.conv or {}).get("output_padding") or 0, nd - 2)
            kw["output_padding"] = tuple(outp[j - 2] for j in kept)
            name = f"conv_transpose{len(kept)}d"
            fn = CONVT_FN[name]
        else:
            name = f"conv{len(kept)}d"
            fn = CONV_FN[name]
        y = ed.add(at, "conv_kept", "call_function", q(fn), (flat, w2, None), kw,
                   [m.out_shape[0], m.n, *(m.out_shape[j] for j in kept)], m.dtype)
        result = (f"window sums of the input over dims {red} ({eq}), then F.{name} over the kept dims with "
                  f"{cin * taps} input channels (channel, reduced tap)")
    y = ed.add(at, "keep", "call_method", "reshape", (y, (-1, *keep_shape[1:])), {}, keep_shape, m.dtype)
    count = math.prod(m.out_shape[j] for j in red)
    running = ed.add(at, "pos_mean", "call_function", MUL, (y, 1.0 / count), {}, keep_shape, m.dtype)
    if m.bias is not None:
        b = m.bias if isinstance(m.bias, NodeRef) else ed.param(at, m.bias["attr"], [m.n], m.dtype)
        bv = ed.add(at, "bias_ch", "call_method", "reshape", (b, (m.n, *[1] * (nd - 2))), {}, [m.n, *[1] * (nd - 2)],
                    m.dtype)
        running = ed.add(at, "plus_bias", "call_function", ADD, (running, bv), {}, keep_shape, m.dtype)
    prev = NodeRef(m.node)
    for s in steps:
        running = clone(ed, g, at, s.node, prev, running, keep_shape, m.dtype)
        prev = NodeRef(s.node)
    if r.op == "sum":
        running = ed.add(at, "times_positions", "call_function", MUL, (running, float(count)), {}, keep_shape, m.dtype)
    if not r.keepdim:
        running = ed.add(at, "squeeze", "call_method", "squeeze", (running, tuple(red)), {}, g.tensor(r.node)[0],
                         m.dtype)
    ed.replace_uses(r.node, running)
    ed.drop_dead(had, {m.node, r.node})   # r.node may be a pooling module (stateless)
    ed.desc["shapes_fixed"] = True   # the tap windows are the recorded sizes'
    return ed, result
