"""A sum or mean after a linear map, moved before it.

    (x @ W^T + b).sum(-1)            ->  x @ W.sum(0) + b.sum()       (a GEMM becomes a GEMV)
    ((x @ W^T + b) * a + c).mean(-1) ->  x @ (a W).mean(0) + mean(a b + c)
    conv(x, W, b).sum(1)             ->  conv(x, W.sum(0, keepdim=True), b.sum())   (one output channel)
    convT(x, W, b).sum(1)            ->  convT(x, W.sum(1, keepdim=True), b.sum())
    conv(x, W, b).mean((2, 3))       ->  (tap-window sums of x) x W + b  (graph_stage.conv_positions)

Exact in real arithmetic because the reduction runs over exactly the map's output features and
every op between is affine in them (a scale, a divide, an add or subtract of a constant or of a
per-feature tensor, a negation): sum_n (a_n (x . W_n + b_n) + c_n) = x . (sum_n a_n W_n) +
sum_n (a_n b_n + c_n).  The summed weights are computed in ModelNew.forward from the live
parameters on every call (a reduction of W, much cheaper than the GEMM), so ModelNew still takes
Model's state_dict and follows parameter updates.  Refused, with the reason: a nonlinear op in
between, a value in between read elsewhere (the map would still run), a reduction over other
dims, in-place ops, fp16 / bf16 (the summed weights are rounded to the low precision before the
product), grouped or non-zero-padded convolutions.
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F

from mtmc.module.functionalize import mutations
from mtmc.module.fx_ops import Graph, NodeRef, q
from mtmc.module.graph_stage.conv_positions import positions_refusal, positions_rewrite, positions_work
from mtmc.module.graph_stage.common import (
    EXACT_DTYPES, LinearMap, Reduction, Step, chain_step, feeding_map, reduction, walk_chain,
)
from mtmc.module.graph_stage.edit import Editor, numel, readers
from mtmc.module.graph_stage.records import Candidate, Work

RULE = "reduction_before_linear"
MUL, ADD, SUB, DIV = q(operator.mul), q(operator.add), q(operator.sub), q(operator.truediv)
SUM, MATMUL = q(torch.sum), q(torch.matmul)


class _Affine:
    """a * y + c per feature, a and c each None (1 / 0), a float, or a NodeRef ([N] or [])
    made in the editor as the chain is read."""

    def __init__(self, ed: Editor, before: str, n: int, dtype: str):
        self.ed, self.before, self.n, self.dtype = ed, before, n, dtype
        self.a, self.c = None, None

    def _shape(self, *vals) -> list[int]:
        return list(torch.broadcast_shapes(*(tuple(self.ed_shape(v)) for v in vals if isinstance(v, NodeRef))))

    def ed_shape(self, v: NodeRef) -> list[int]:
        node = next(n for n in self.ed.nodes if n["name"] == v.name)
        return node["value"]["tensor"]["shape"]

    def op(self, target: str, p, r, base: str):
        if not isinstance(p, NodeRef) and not isinstance(r, NodeRef):
            return {MUL: operator.mul, ADD: operator.add, SUB: operator.sub, DIV: operator.truediv}[target](p, r)
        return self.ed.add(self.before, base, "call_function", target, (p, r), {}, self._shape(p, r), self.dtype)

    def mul(self, p, r):
        if p is None or (not isinstance(p, NodeRef) and p == 1.0):
            return r
        if r is None or (not isinstance(r, NodeRef) and r == 1.0):
            return p
        return self.op(MUL, p, r, "scale")

    def add(self, p, r):
        if p is None:
            return r
        if r is None:
            return p
        return self.op(ADD, p, r, "shift")

    def vector(self, ref: NodeRef, shape: list[int]) -> NodeRef:
        """A per-feature operand as [N] (or [] when it is one value)."""
        new = [self.n] if numel(shape) == self.n and self.n != 1 else []
        if shape == new:
            return ref
        return self.ed.add(self.before, "vec", "call_method", "reshape", (ref, tuple(new) if new else ()), {},
                           new, self.dtype)

    def step(self, s: Step, other_shape: list[int] | None) -> None:
        v = s.other if not isinstance(s.other, NodeRef) else self.vector(s.other, other_shape)
        if s.op == "mul":
            self.a, self.c = self.mul(1.0 if self.a is None else self.a, v), self.mul(self.c, v) if self.c is not None else None
        elif s.op == "div":
            inv = 1.0 / v if not isinstance(v, NodeRef) else self.op(DIV, 1.0, v, "inv")
            self.a, self.c = self.mul(1.0 if self.a is None else self.a, inv), self.mul(self.c, inv) if self.c is not None else None
        elif s.op == "add":
            self.c = self.add(self.c, v)
        elif s.op == "sub":
            self.c = self.add(self.c, self.mul(v, -1.0))
        elif s.op == "rsub":
            self.a = self.mul(-1.0 if self.a is None else self.a, -1.0) if self.a is not None else -1.0
            self.c = self.add(self.mul(self.c, -1.0) if self.c is not None else None, v)
        elif s.op == "neg":
            self.a = -1.0 if self.a is None else self.mul(self.a, -1.0)
            self.c = self.mul(self.c, -1.0) if self.c is not None else None


def _ref(ed: Editor, before: str, ref, shape, dtype) -> NodeRef:
    return ref if isinstance(ref, NodeRef) else ed.param(before, ref["attr"], shape, dtype)


def _work_before(m: LinearMap, r: Reduction, chain_len: int) -> Work:
    k = m.weight_shape[1] if m.kind == "linear" else m.weight_shape[0]
    rows = numel(m.out_shape) // m.n
    if m.conv is None:
        gemm = Work(2.0 * rows * m.n * k, 4.0 * (rows * k + m.n * k + rows * m.n), 1)
    else:
        taps = numel(m.weight_shape) // m.n if "transpose" not in m.kind else numel(m.weight_shape) // m.weight_shape[0]
        cin = numel(m.weight_shape[1:]) if "transpose" not in m.kind else m.weight_shape[0]
        xs = numel(m.out_shape) // m.n   # output positions
        gemm = Work(2.0 * xs * m.n * (taps if "transpose" not in m.kind else cin * numel(m.weight_shape[2:])),
                    4.0 * (numel(m.out_shape) + numel(m.weight_shape)) + 4.0 * xs * max(1, cin // 4), 1)
    red = Work(float(numel(m.out_shape)) * (1 + chain_len), 4.0 * (numel(m.out_shape) + rows), 1)
    return gemm + red


def _work_after(m: LinearMap, extra_launches: int) -> Work:
    rows = numel(m.out_shape) // m.n
    if m.conv is None:
        k = m.weight_shape[1] if m.kind == "linear" else m.weight_shape[0]
        wsum = Work(float(m.n * k), 4.0 * (m.n * k + k), 1)
        gemv = Work(2.0 * rows * k, 4.0 * (rows * k + k + rows), 1)
        return wsum + gemv + Work(0.0, 0.0, extra_launches)
    wsum = Work(float(numel(m.weight_shape)), 4.0 * numel(m.weight_shape), 1)
    before = _work_before(m, Reduction(m.node, "sum", m.x, [1], False, False), 0)
    conv1 = Work(before.flops / max(m.n, 1), 4.0 * rows * 2 + before.bytes / max(m.n, 1) / 4, 1)
    return wsum + conv1 + Work(0.0, 0.0, extra_launches)


def candidates(desc: dict) -> list[Candidate]:
    g = Graph(desc)
    out = []
    for n in g.nodes:
        r = reduction(g, n["name"])
        if r is None:
            continue
        c = _candidate(desc, g, n["name"], r)
        if c is not None:
            out.append(c)
    return out


def _refuse(g: Graph, r_name: str, m: LinearMap, why: str) -> Candidate:
    return Candidate(RULE, r_name, g.path, False, why, ops=[g.words(m.node), g.words(r_name)])


def _candidate(desc: dict, g: Graph, name: str, r) -> Candidate | None:
    if isinstance(r, str):
        x = g.args(name)[0][0]
        m, _ = feeding_map(g, x) if isinstance(x, NodeRef) else (None, [])
        return _refuse(g, name, m, f"a {r} is not rewritten") if m else None
    m, walked = feeding_map(g, r.x)
    if m is None:
        return None
    ops = [g.words(m.node), *(g.words(w) for w in walked), g.words(name)]
    refuse = lambda why: Candidate(RULE, name, g.path, False, why, ops=ops)   # noqa: E731
    if m.dtype not in EXACT_DTYPES:
        return refuse(f"dtype {m.dtype}: the summed weights would be rounded to {m.dtype} before the product "
                      "(accumulation risk at the tolerance); only float32 / float64 are rewritten")
    chain = walk_chain(g, m.node, name)
    changers = [node for node, value in mutations(g) if value in (m.node, *walked)]
    if changers:
        return refuse(f"an in-place op ({g.words(changers[0])}) changes a value between the linear map and the "
                      f"{r.op}: its order with the reduction matters, so nothing is moved")
    if chain is None:
        readers_ = [u for w in [m.node, *walked] for u in g.users[w] if u not in [*walked, name]]
        return refuse(f"the value between the linear map and the {r.op} is also read by "
                      f"{g.words(readers_[0]) if readers_ else 'another op'}: the map would still run, "
                      "so moving the reduction saves nothing")
    steps = []
    for node in chain[:-1]:
        prev = steps[-1].node if steps else m.node
        s = chain_step(g, node, prev, m.out_shape, m.feature_dim)
        if isinstance(s, str):
            return refuse(f"{s} between the linear map and the {r.op}: the {r.op} does not commute with it")
        steps.append(s)
    nd = len(m.out_shape)
    if r.dims and m.feature_dim not in r.dims and m.conv is None:   # over rows: the reduction moves onto x
        return _rows_candidate(desc, g, name, m, r, steps, ops)
    if m.conv is not None and m.feature_dim not in r.dims:   # over positions: window sums of the input
        return _positions_candidate(desc, g, name, m, r, steps, ops)
    if r.dims != [m.feature_dim]:
        over = "every dim" if r.every else f"dims {r.dims}"
        return refuse(f"the {r.op} runs over {over}, not exactly the map's output features (dim {m.feature_dim} "
                      f"of {nd}) nor only its rows nor only a conv's positions; only those reductions are moved "
                      "before the map")
    if m.conv is not None:
        why = _conv_refusal(m)
        if why:
            return refuse(why)
    try:
        ed, result, launches = _apply(desc, g, m, r, steps)
    except _Unsupported as e:
        return refuse(str(e))
    cand = Candidate(RULE, name, g.path, True,
                     f"exact: the {r.op} runs over exactly the {m.n} output features of {g.words(m.node)} and "
                     + (f"the ops between ({', '.join(s.op for s in steps)}) are affine in them, so they commute "
                        "with it" if steps else "nothing lies between them")
                     + "; the summed weights are computed from the live parameters on every call",
                     ops=ops, result=result, before=_work_before(m, r, len(steps)),
                     after=_work_after(m, launches), dtype=m.dtype, apply=ed.desc)
    return cand


class _Unsupported(Exception):
    pass


def _conv_refusal(m: LinearMap) -> str | None:
    c = m.conv or {}
    if len(m.weight_shape) != len(m.out_shape):   # [C, *spatial]: dim 1 is not the channels
        return "an unbatched conv input (no batch dim)"
    if c.get("groups", 1) != 1:
        return f"a grouped conv (groups={c.get('groups')}): each output channel sees only its group's inputs"
    if c.get("padding_mode", "zeros") != "zeros":
        return f"padding_mode {c.get('padding_mode')!r} (only zero padding is rebuilt as F.{m.kind})"
    if isinstance(c.get("padding"), str) and c["padding"] not in ("valid", "same"):
        return f"padding {c['padding']!r}"
    return None


def _apply(desc: dict, g: Graph, m: LinearMap, r: Reduction, steps: list[Step]) -> tuple[Editor, str, int]:
    ed = Editor(desc)
    had = readers(desc)
    at = r.node
    aff = _Affine(ed, at, m.n, m.dtype)
    for s in steps:
        aff.step(s, g.tensor(s.other)[0] if isinstance(s.other, NodeRef) else None)
    mean = r.op == "mean"
    a = aff.a
    if mean:
        a = aff.mul(1.0 if a is None else a, 1.0 / m.n)
    w = _ref(ed, at, m.weight, m.weight_shape, m.dtype)
    vec = isinstance(a, NodeRef) and aff.ed_shape(a) == [m.n] and m.n != 1
    if m.conv is None:
        axis = 1 if m.kind == "matmul" else 0
        k = m.weight_shape[1 - axis]
        if vec:   # sum_n a_n W_n
            ws = ed.add(at, "wsum", "call_function", MATMUL, (a, w) if axis == 0 else (w, a), {}, [k], m.dtype)
        else:
            ws = ed.add(at, "wsum", "call_function", SUM, (w, axis), {}, [k], m.dtype)
            ws = aff.mul(ws, a) if a is not None else ws
        prod = ed.add(at, "xw", "call_function", MUL, (m.x, ws), {}, g.tensor(m.x)[0], m.dtype)
        red_shape = g.tensor(r.node)[0]
        res = ed.add(at, "gemv", "call_function", SUM, (prod,), {"dim": -1, "keepdim": r.keepdim}, red_shape, m.dtype)
        result = f"x * W.sum over the {m.n} features, summed over the last dim (a GEMV)"
    else:
        transposed = "transpose" in m.kind
        axis = 1 if transposed else 0
        wshape = list(m.weight_shape)
        one = [*wshape[:axis], 1, *wshape[axis + 1:]]
        wa = w
        if vec:   # a_n scales output channel n of the weight
            view = [1] * len(wshape)
            view[axis] = m.n
            av = ed.add(at, "chscale", "call_method", "reshape", (a, tuple(view)), {}, view, m.dtype)
            wa = ed.add(at, "wscaled", "call_function", MUL, (w, av), {}, wshape, m.dtype)
        ws = ed.add(at, "wsum", "call_function", SUM, (wa,), {"dim": axis, "keepdim": True}, one, m.dtype)
        if a is not None and not vec:
            ws = aff.mul(ws, a)
        c = m.conv
        fn = {"conv1d": F.conv1d, "conv2d": F.conv2d, "conv3d": F.conv3d, "conv_transpose1d": F.conv_transpose1d,
              "conv_transpose2d": F.conv_transpose2d, "conv_transpose3d": F.conv_transpose3d}[m.kind]
        kw = {"stride": _tup(c.get("stride", 1)), "padding": c.get("padding", 0) if isinstance(c.get("padding"), str)
              else _tup(c.get("padding", 0)), "dilation": _tup(c.get("dilation", 1)), "groups": 1}
        if transposed:
            kw["output_padding"] = _tup(c.get("output_padding", 0))
        conv_shape = [*m.out_shape[:1], 1, *m.out_shape[2:]]
        res = ed.add(at, "conv1ch", "call_function", q(fn), (m.x, ws, None), kw, conv_shape, m.dtype)
        if not r.keepdim:
            res = ed.add(at, "squeeze", "call_method", "squeeze", (res, 1), {}, g.tensor(r.node)[0], m.dtype)
        result = f"F.{m.kind} with the weights summed over the {m.n} output channels (one output channel)"
    # the constant: sum_n (a_n b_n + c_n) (a holds the 1 / N of a mean; c gets it here), one reduction
    cterm = aff.mul(aff.c, 1.0 / m.n) if aff.c is not None and mean else aff.c
    bterm = None
    if m.bias is not None:
        b = _ref(ed, at, m.bias, [m.n], m.dtype)
        bterm = aff.mul(b, a) if a is not None else b
    v = aff.add(bterm, cterm)
    if v is None:
        const = None
    elif isinstance(v, NodeRef) and aff.ed_shape(v) == [m.n] and m.n != 1:
        const = ed.add(at, "const", "call_function", SUM, (v,), {}, [], m.dtype)
    else:   # one value for every feature
        const = aff.mul(v, float(m.n))
    if const is not None:
        res = ed.add(at, "plus_const", "call_function", ADD, (res, const), {}, g.tensor(r.node)[0], m.dtype)
    ed.replace_uses(r.node, res)
    ed.drop_dead(had, {m.node, r.node})   # r.node may be a pooling module (stateless)
    # kernels it adds besides the weight sum and the GEMV (or one-channel conv): the constant's
    # reduction and the add of it (the scales fuse into those kernels)
    launches = (1 if isinstance(const, NodeRef) and const.name.startswith("rw_const") else 0) + (1 if const is not None else 0)
    return ed, result, launches


def _tup(v):
    return tuple(v) if isinstance(v, (list, tuple)) else v


def _rows_candidate(desc: dict, g: Graph, name: str, m: LinearMap, r: Reduction, steps: list[Step],
                    ops: list[str]) -> Candidate:
    """A mean (or sum) over rows of a linear map's output, moved onto its input:
    mean_b f(x_b W^T + b) = f(mean_b(x_b) W^T + b) for f affine per feature (its constants are the
    same for every row); a sum is the mean times the number of rows, read from x's sizes at run
    time.  The GEMM runs on the reduced rows only."""
    ed = Editor(desc)
    had = readers(desc)
    at = r.node
    xs = g.tensor(m.x)[0]
    kept = [1 if i in r.dims else s for i, s in enumerate(m.out_shape)]
    xm = ed.add(at, "x_mean", "call_function", q(torch.mean), (m.x,), {"dim": tuple(r.dims), "keepdim": True},
                [1 if i in r.dims else s for i, s in enumerate(xs)], m.dtype)
    running = _clone_with(ed, g, at, m.node, m.x, xm, kept, m.dtype)
    for s_ in steps:
        running = _clone_with(ed, g, at, s_.node, NodeRef(_prev(steps, s_, m)), running,
                              kept, m.dtype)
    if r.op == "sum":
        count, seen = None, 1
        for d in r.dims:
            size = ed.add(at, "rows", "call_method", "size", (m.x, d), {}, None, m.dtype, scalar=xs[d])
            seen *= xs[d]
            count = size if count is None else ed.add(at, "rows", "call_function", MUL, (count, size), {}, None,
                                                      m.dtype, scalar=seen)
        running = ed.add(at, "times_rows", "call_function", MUL, (running, count), {}, kept, m.dtype)
    if not r.keepdim:
        running = ed.add(at, "squeeze", "call_method", "squeeze", (running, tuple(r.dims)), {}, g.tensor(r.node)[0],
                         m.dtype)
    ed.replace_uses(r.node, running)
    ed.drop_dead(had, {m.node, r.node})   # r.node may be a pooling module (stateless)
    fewer = max(1, numel(kept) // m.n)
    k = g.tensor(m.x)[0][-1]
    before = _work_before(m, r, len(steps))
    after = (Work(float(numel(xs)), 4.0 * (numel(xs) + fewer * k), 1)
             + Work(2.0 * fewer * m.n * k, 4.0 * (fewer * k + m.n * k + fewer * m.n), 1)
             + Work(0.0, 0.0, 1 if r.op == "sum" else 0))
    return Candidate(RULE, name, g.path, True,
                     f"exact: the {r.op} runs over rows of {g.words(m.node)} (dims {r.dims}), along which the map "
                     "and the ops after it (constants per feature) are the same affine function, so the mean of "
                     "the rows goes through them" + (" (a sum is that mean times the number of rows, read from "
                                                    "x's sizes at run time)" if r.op == "sum" else ""),
                     ops=ops, result=f"the {r.op} of x over dims {r.dims} first, then the map on the reduced rows",
                     before=before, after=after, dtype=m.dtype, apply=ed.desc)


def _positions_candidate(desc: dict, g: Graph, name: str, m: LinearMap, r: Reduction, steps: list[Step],
                         ops: list[str]) -> Candidate:
    """A mean (or sum) over a conv's positions: window sums of its input, then a smaller conv
    or a GEMM (graph_stage.conv_positions)."""
    xs = g.tensor(m.x)[0]
    why = positions_refusal(m, r, xs)
    if why:
        return Candidate(RULE, name, g.path, False, why, ops=ops)
    ed, result = positions_rewrite(desc, g, m, r, steps, _clone_with)
    return Candidate(RULE, name, g.path, True,
                     f"exact: the {r.op} runs over positions {r.dims} of {g.words(m.node)}; summed over them, the "
                     "conv is the input's sums over each tap's window (borders, padding and strides included) "
                     "times that tap's weights, and the ops between (constants per channel) commute with a mean "
                     "over positions", ops=ops, result=result, before=_work_before(m, r, len(steps)),
                     after=positions_work(m, r, xs), dtype=m.dtype, apply=ed.desc)


def _prev(steps: list[Step], s_: Step, m: LinearMap) -> str:
    """The node a chain step reads its running value from."""
    i = steps.index(s_)
    return steps[i - 1].node if i else m.node


def _clone_with(ed: Editor, g: Graph, before: str, node: str, old: NodeRef, new: NodeRef, shape, dtype) -> NodeRef:
    """A copy of `node` (before `before`) reading `new` where it read `old`, producing `shape`."""
    src = g.by_name[node]

    def swap(a):
        if isinstance(a, list):
            return [swap(x) for x in a]
        if isinstance(a, dict):
            if set(a) == {"node"}:
                return {"node": new.name} if a["node"] == old.name else a
            return {k: swap(v) for k, v in a.items()}
        return a
    ref = ed.add(before, node, src["op"], src["target"], (), {}, shape, dtype)
    made = next(n for n in ed.nodes if n["name"] == ref.name)
    made["args"], made["kwargs"] = swap(src["args"]), swap(src["kwargs"])
    return ref
