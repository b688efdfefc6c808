"""Split a captured forward graph into fusion groups the op catalog can serve.

Input: one graph of module.capture's result (plain JSON).  Output: groups, each a KernelSpec at
the shapes seen at run time plus a *binding* saying where every kernel input comes from (a
graph value or a parameter, and the reshape-only view that turns it into the kernel's [M, N] /
[B, M, K] layout) and how the kernel's output is viewed back into the node's shape.

Groups, found in graph order:
  * matmul / linear / bmm, with the pointwise epilogue that follows (bias, activation, scale,
    residual);
  * convolutions (nn.Conv*d, nn.ConvTranspose*d, F.conv*), with their bias and the pointwise
    tail that follows, per-channel operands read as vectors (module.conv_fusion);
  * attention (F.scaled_dot_product_attention, the hand-written softmax(q @ k^T * s) @ v;
    module.attention_fusion);
  * reductions, softmax and norms (LayerNorm, RMSNorm, a hand-written RMSNorm) with the
    pointwise prologue that feeds them and, for softmax and norms, the epilogue after them;
  * chains of the remaining pointwise ops.
A node joins a group only when all its users are in the group (the kernel returns one value),
so the fused group computes exactly what the nodes did.  Everything else (concatenations,
views, ops outside the catalog) stays a PyTorch call; `torch_ops` says which and
why.  Broadcast operands (a [C, 1, 1] bias on NCHW, an [S, S] mask over heads) are read in place
as periodic operands by elementwise and row-wise kernels; a one-value operand (a 0-d parameter)
is loaded once by any kernel, from its tensor at run time; where a broadcast operand cannot be
read in place (a matmul epilogue, kept dims split by broadcast ones) it is expanded to full size
first, which costs memory traffic, and the group's notes say so.
"""
from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, field

import torch

from mtmc.kernels import pointwise
from mtmc.module import (attention_fusion, conv_fusion, identities, loss_fusion, matmul_forms, norm_fusion,
                         pointwise_fusion, pool_fusion, scan_fusion, view_fusion, where_fusion)
from mtmc.kernels.catalog import family_of
from mtmc.module.functionalize import mutations
from mtmc.module.fx_ops import (
    RSQRT, SQRT, TRANSPOSES, Anchor, Classifier, Graph, NodeRef, Pointwise, Reject, q,
)
from mtmc.kernels.spec import DTYPES, KernelSpec


# -- groups -----------------------------------------------------------------------------------

def _broadcast_pattern(oshape: list[int], full: list[int], row_major: bool) -> dict | None:
    """How a kernel reads in place an operand of shape `oshape` broadcast to `full`: {"scalar":
    True} for one value (loaded once, whatever the kernel's layout), a periodic pattern on a
    row-major kernel; None when it must be expanded to `full` first."""
    if math.prod(oshape) == 1:
        return {"scalar": True}
    return _periodic_pattern(oshape, full) if row_major else None


def _periodic_pattern(oshape: list[int], full: list[int]) -> dict | None:
    """{"every", "period"} when an operand of shape `oshape` broadcast to `full` is one run of
    kept dims (so element i of the row-major full tensor meets operand[(i // every) % period]);
    None when its kept dims are split by broadcast ones ([B, 1, S, 1])."""
    o = [1] * (len(full) - len(oshape)) + list(oshape)
    kept = [i for i, (a, f) in enumerate(zip(o, full)) if a == f and f > 1]
    if not kept:
        return {"every": 1, "period": 1}
    lo, hi = kept[0], kept[-1]
    if any(o[i] != full[i] for i in range(lo, hi + 1)):
        return None
    return {"every": math.prod(full[hi + 1:]), "period": math.prod(full[lo:hi + 1])}


@dataclass
class Group:
    """One kernel's worth of the graph, with everything needed to call it in place.

    args:   the values the wrapper takes, in order: {"node": name} or {"attr": param path}.
    inputs: one per kernel input, in the family's order: {"arg": i, "view": kind, ...}.
            views: "rows" ([-1, last dim]), "periodic" (a broadcast operand, flat, read in
            place: pointwise's periodic steps), "scalar" (a one-value operand as [1], loaded
            once: pointwise's scalar steps), "strided" (the contiguous buffer as [-1, "dim"]: a
            reduction over a middle dim reads it in place), "flat" ([1, -1]),
            "vector" ([-1]), "batched" ([-1, M, K]), "as_is", "like" (expanded to the shape
            of "of": "main" or "out", then viewed like it).
    out:    how the output is made and viewed back: {"kind": "same" | "reduced" | "matmul" |
            "bmm" | "conv", ...}.
    guards: scalar args the kernel was specialized for: {"arg": i, "value": v}.
    """
    id: int
    graph: str                       # the captured graph's module path ("" = Model itself)
    family: str
    nodes: list[str]
    replaces: list[str]
    ops: list[str]
    spec: dict
    args: list[dict]
    inputs: list[dict]
    out: dict
    guards: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Group":
        return cls(**d)


class _Builder:
    """Collects one group's nodes, kernel inputs, wrapper args, guards and notes."""

    def __init__(self, g: Graph, main: NodeRef, dtype: str):
        self.g, self.dtype = g, dtype
        self.nodes: list[str] = []
        self.inputs: list[dict] = []
        self.args: list[dict] = []
        self.guards: list[dict] = []
        self.notes: list[str] = []
        # pure views inside the group (module.view_fusion): [recorded shape, kernel shape] of the
        # main input read before a view, [op output shape, tail shape] of the result after one
        self.in_view: list | None = None
        self.out_view: list | None = None
        self.arg(main)  # the main input is always the wrapper's first argument

    def arg(self, ref) -> int:
        d = {"node": ref.name} if isinstance(ref, NodeRef) else dict(ref)
        if d not in self.args:
            self.args.append(d)
        return self.args.index(d)

    def guard(self, ref, value: float) -> None:
        """A scalar computed by the graph (from a size, say) is baked into the kernel; the
        wrapper checks it is still that value."""
        if isinstance(ref, NodeRef):
            g = {"arg": self.arg(ref), "value": value}
            if g not in self.guards:
                self.guards.append(g)


# modules classifying and building more anchors: convolutions, pooling, scans, losses
PLUGIN_FAMILIES = {conv_fusion: ("conv",), norm_fusion: ("norm",), pool_fusion: ("pool",), scan_fusion: ("scan",),
                   loss_fusion: ("loss",),
                   # attention's patterns (softmax(q @ k^T * s) @ v written out) before matmul_forms'
                   attention_fusion: ("attention",), matmul_forms: ("matmul_form",),
                   where_fusion: ()}   # torch.where / masked_fill: pointwise steps, no family of its own
PLUGINS = tuple(PLUGIN_FAMILIES)
# anchors PyTorch runs in its library kernels (cuDNN, cuBLAS): the ones a plan may leave there
LIBRARY_FAMILIES = ("conv", "matmul")
_BINOP_STEP = {"add": "add", "sub": "sub", "mul": "mul", "maximum": "maximum", "minimum": "minimum", "div": "div",
               "prelu": "prelu"}


class Partitioner:
    def __init__(self, desc: dict, first_id: int = 0, library: dict[str, str] | None = None):
        """library: nodes (name -> why) whose conv or matmul anchor stays PyTorch's (cuDNN,
        cuBLAS), so what followed it in its group becomes a group of its own (module_flow.regroup);
        the other nodes named are planned as usual."""
        self.library = dict(library or {})
        self._classify(desc)
        # identity ops (clone, detach, eval dropout ...) are read past, so they split no group
        self.dropped = identities.identity_nodes(self.g, self.sem, mutations(self.g))
        if self.dropped:
            self._classify(identities.without_identities(desc, self.dropped))
        self.taken: set[str] = set()
        self.shared: set[str] = set()   # cheap producers recomputed inside each consumer
        self.mutations = mutations(self.g)   # of the graph without its identities
        self.groups: list[Group] = []
        self.next_id = first_id
        self.no_views: set[str] = set()   # anchors whose group reads through no view (view_fusion.Stranded)

    def _classify(self, desc: dict) -> None:
        self.g = Graph(desc, data_users=True)
        classify = Classifier(self.g, plugins=PLUGINS)
        self.sem: dict[str, object] = {}
        self.why: dict[str, str] = {}
        for n in self.g.nodes:
            try:
                s = classify(n["name"])
            except Reject as e:
                s, self.why[n["name"]] = None, str(e)
            except Exception as e:  # a form the classifier does not know: PyTorch runs it, the report says so
                s, self.why[n["name"]] = None, _not_analysed(e)
            if s is not None:
                self.sem[n["name"]] = s

    def _mutated_inside(self, nodes: list[str], args: list[dict]) -> str | None:
        """An in-place op outside the group that changes one of its inputs between the group's
        first and last node: the kernel, called at the last one, would read the changed value."""
        lo, hi = min(map(self.g.order.get, nodes)), max(map(self.g.order.get, nodes))
        read = {a["node"] for a in args if "node" in a}
        for node, value in self.mutations:
            if node not in nodes and value in read and lo < self.g.order[node] < hi:
                return node
        return None

    def _ref_tensor(self, ref) -> tuple[list[int], str] | None:
        if isinstance(ref, NodeRef):
            return self.g.tensor(ref)
        module, _, name = ref["attr"].rpartition(".")
        p = self.g.modules.get(module, {}).get("params", {}).get(name)
        return (list(p["shape"]), p["dtype"]) if p else None

    def builder(self, main: NodeRef, dtype: str) -> _Builder:
        """A new group's builder, `main` its first argument (for plugins' groups)."""
        return _Builder(self.g, main, dtype)

    def _single_user(self, name: str) -> str | None:
        users = self.g.users[name]
        return users[0] if len(users) == 1 else None

    # -- pointwise chains --
    def _step(self, node: str, running: str, b: _Builder, full_shape: list[int], operand_view: dict,
              vector_ok: bool) -> list[dict] | None:
        """Steps applying pointwise `node` to the running value; any other tensor it reads
        becomes a kernel input.  None (and `b` untouched) when `node` cannot continue the chain."""
        s = self.sem.get(node)
        if not isinstance(s, Pointwise) or (node in self.taken and node not in self.shared) or node in b.nodes:
            return None
        if self.g.tensor(node) != (full_shape, b.dtype):
            return None
        if s.binop is None:
            if pointwise.uses_index(s.steps):  # tril/triu: a matmul epilogue only (its own hook)
                return None
            return list(s.steps) if s.inputs and s.inputs[0] == NodeRef(running) else None
        x, y = s.inputs
        first = x == NodeRef(running)
        masked = s.binop in pointwise.MASKED   # the running value is what a mask fills
        if (not first and y != NodeRef(running)) or ((masked or s.binop == "prelu") and not first):
            return None
        other = y if first else x
        if other == NodeRef(running):   # x * x, x + x
            return {"mul": [{"op": "square"}], "add": [{"op": "scale", "value": 2.0}]}.get(s.binop)
        t = self.g.tensor(other) if isinstance(other, NodeRef) else None
        if t is None:
            return self._scalar_step(s.binop, other, first, b)
        if other.name in b.nodes or t[1] != ("bool" if masked else b.dtype):
            return None
        # an operand made by one-input steps of a tensor read nowhere else: the steps run on the load
        other, pre, pre_nodes = pointwise_fusion.operand_path(self, other, node, b) if not masked else (other, [], [])
        oshape = s.operand_shape or t[0]
        if oshape != full_shape:
            try:
                if list(torch.broadcast_shapes(tuple(oshape), tuple(full_shape))) != full_shape:
                    return None
            except RuntimeError:
                return None
        is_vector = oshape and oshape[-1] == full_shape[-1] and math.prod(oshape) == oshape[-1]
        if vector_ok and is_vector and s.binop == "add" and oshape != full_shape and not pre:
            b.inputs.append({"arg": b.arg(other), "view": "vector"})
            return [{"op": "bias"}]
        pattern = None
        if oshape != full_shape:
            # read in place: one value anywhere, a broadcast one on a row-major kernel (periodic steps)
            pattern = _broadcast_pattern(oshape, full_shape, operand_view.get("of") == "main")
            if pattern is None and (masked or s.operand_shape):   # a broadcast mask is read in place by the
                return None                                       # next group; a PReLU weight cannot be expanded
            if pattern is None:
                b.notes.append(f"{self.g.words(other.name)} of shape {oshape} is expanded to {full_shape} "
                               "for the kernel (a copy)")
        view = operand_view if pattern is None else {"view": "scalar" if "scalar" in pattern else "periodic"}
        b.inputs.append({"arg": b.arg(other), **view})
        b.nodes += pre_nodes
        pattern = {**(pattern or {}), **({"pre": pre} if pre else {})}
        if masked:
            return [{"op": s.binop, "value": s.value, **pattern}]
        if s.binop == "sub" and not first:
            return [{"op": "neg"}, {"op": "add", **pattern}]
        if s.binop == "div" and not first:
            return [{"op": "rdiv", **pattern}]
        return [{"op": _BINOP_STEP[s.binop], **pattern}]

    def _scalar_step(self, binop: str, other, first: bool, b: _Builder) -> list[dict] | None:
        num = self.g.number(other)
        steps = pointwise_fusion.scalar_steps(binop, num, first) if num is not None else None
        if steps is not None:
            b.guard(other, num)
        return steps

    def _extend(self, start: str, b: _Builder, full_shape: list[int], operand_view: dict,
                vector_ok: bool, first=None, views: bool = False) -> tuple[list[dict], str]:
        """Pointwise steps after `start` while each value has one user that continues the chain;
        `first(node, running)`, when given, is asked before the usual steps (a family's own).
        views: the chain reads through pure views (module.view_fusion), the kernel still running
        over `full_shape` (the result is viewed to the last step's shape: b.out_view)."""
        chain, last = [], start
        shape, o_view, v_ok = full_shape, operand_view, vector_ok
        while (user := self._single_user(last)) is not None:
            run = view_fusion.run_after(self, user) if views else ([], user)
            if run is None:
                break
            passed, node = run
            running = passed[-1] if passed else last
            if passed:
                shape = self.g.tensor(running)[0]
                o_view, v_ok = view_fusion.context(full_shape, shape, operand_view, vector_ok)
            steps = first(node, running) if first and not passed else None
            if steps is None:
                steps = self._step(node, running, b, shape, o_view, v_ok)
            if steps is None:
                if views:
                    view_fusion.stopped(self, b, node, "epilogue")
                    if passed:
                        view_fusion.note_refused(self, b, passed, node, "epilogue")
                break
            chain += steps
            b.nodes += [*passed, node, *self.sem[node].covers]
            if passed:
                b.out_view = [list(full_shape), list(shape)]
            last = node
        return chain, last

    def _walk_back(self, x: NodeRef, shape: list[int], dtype: str, operand_view: dict,
                   vector_ok: bool, views: bool = False) -> list[tuple[str, str]]:
        """The pointwise nodes feeding x, each used only by the next, as (node, its running
        input) in graph order.  views: also the pure views between them (module.view_fusion),
        as (view, its input), each used only by the next; steps before a view are asked in the
        shape they run in.  Never starts with a view (the chain's first value is read as it is)."""
        links, cur = [], x.name
        kshape, base_view, base_ok = shape, operand_view, vector_ok
        scratch = _Builder(self.g, x, dtype)  # only asks whether each step would be accepted
        while True:
            src = view_fusion.source(self.g, cur) if views else None
            if src is not None and cur not in self.taken and len(self.g.users[cur]) == 1:
                links.append((cur, src.name))
                cur = src.name
                shape = self.g.tensor(src)[0]
                operand_view, vector_ok = view_fusion.context(kshape, shape, base_view, base_ok)
                continue
            s = self.sem.get(cur)
            if not isinstance(s, Pointwise) or (cur in self.taken and cur not in self.shared):
                break
            if len(self.g.users[cur]) != 1 and not self._shareable(cur, s):
                break
            # the running value has the full shape (a broadcast operand, [K] times [M, K], is not one)
            cands = [r for r in s.inputs if isinstance(r, NodeRef) and self.g.tensor(r) == (shape, dtype)]
            cands.sort(key=lambda r: not isinstance(self.sem.get(r.name), Pointwise))  # prefer longer chains
            chosen = next((r for r in cands
                           if self._step(cur, r.name, scratch, shape, operand_view, vector_ok) is not None), None)
            if chosen is None:
                break
            links.append((cur, chosen.name))
            cur = chosen.name
        links.reverse()
        while links and view_fusion.source(self.g, links[0][0]) is not None:
            links.pop(0)   # views before the first step: the main input is read after them
        return links

    def _prologue(self, links: list[tuple[str, str]], b: _Builder, kshape: list[int], operand_view: dict,
                  vector_ok: bool) -> list[dict]:
        """The steps of _walk_back's links on builder b (whose main input is the first link's
        running value), their nodes taken; each step meets its operands in the shape it runs in,
        and a main input of another shape than the kernel's is viewed to it (b.in_view)."""
        steps: list[dict] = []
        for node, running in links:
            if view_fusion.source(self.g, node) is None:
                o_view, v_ok = view_fusion.context(kshape, self.g.tensor(node)[0], operand_view, vector_ok)
                steps += self._step(node, running, b, self.g.tensor(node)[0], o_view, v_ok)
            b.nodes += [node, *(self.sem[node].covers if node in self.sem else [])]
        start = self.g.tensor(links[0][1])[0] if links else kshape
        if list(start) != list(kshape):
            b.in_view = [list(start), list(kshape)]
        return steps

    def free_prologue(self, x: NodeRef, shape: list[int], dtype: str,
                      views: bool = False) -> tuple[_Builder, list[dict]]:
        """For templates whose prologue reads nothing but x (channel norms, pooling): a builder
        whose main input starts the operand-free pointwise chain feeding x (its nodes taken), and
        that chain's steps.  After a library conv (regroup) this is the conv's activation, applied
        on the load instead of in a pass of its own.  Walking back, the chain stops at the first
        step that reads another tensor.  views: through pure views too (module.view_fusion)."""
        view = {"view": "like", "of": "main"}
        scratch = _Builder(self.g, x, dtype)
        links = self._walk_back(x, shape, dtype, view, vector_ok=False, views=views)
        keep: list[tuple[str, str]] = []
        for node, running in reversed(links):
            if view_fusion.source(self.g, node) is None:
                steps = self._step(node, running, scratch, self.g.tensor(node)[0], view, False)
                if steps is None or pointwise.operands(steps) or scratch.inputs:
                    break
            keep.append((node, running))
        keep.reverse()
        while keep and view_fusion.source(self.g, keep[0][0]) is not None:
            keep.pop(0)
        b = _Builder(self.g, NodeRef(keep[0][1]) if keep else x, dtype)
        return b, self._prologue(keep, b, shape, view, False)

    def _shareable(self, name: str, s: Pointwise) -> bool:
        """A cheap producer (no tensor besides its input) whose every user is a row op reading
        it as its main input: each of them recomputes it rather than reading it back from memory."""
        operands = [r for r in s.inputs[1:] if isinstance(r, NodeRef) and self.g.tensor(r) is not None]
        users = self.g.users[name]
        ok = not operands and all(isinstance(self.sem.get(u), Anchor) and self.sem[u].family not in ("matmul", "conv", "pool")
                                  and self.sem[u].x == NodeRef(name) for u in users)
        if ok:
            self.shared.add(name)
        return ok

    # -- group kinds --
    def _finish(self, family: str, op: str, dims: dict, params: dict, b: _Builder, out: dict,
                replaces: list[str]) -> None:
        spec = KernelSpec(family, op, dims, b.dtype, params)
        fam = family_of(spec)
        try:
            fam.validate(spec)
        except ValueError as e:
            for n in b.nodes:
                self.why.setdefault(n, str(e))
            return
        assert len(fam.inputs(spec)) == len(b.inputs), "binding does not match the family's inputs"
        order = sorted(b.nodes, key=self.g.order.get)
        if (b.in_view or b.out_view) and (read := view_fusion.stranded(self, order, replaces)):
            raise view_fusion.Stranded(f"not read through the views around it: the shape of "
                                       f"{self.g.words(read[0])} inside the group is read later")
        mutation = self._mutated_inside(order, b.args)
        if mutation is not None:
            for n in order:
                self.why.setdefault(n, f"{self.g.words(mutation)} changes an input of its group in place "
                                       "between its ops")
            return
        if b.in_view:
            out = {**out, "in_view": b.in_view}
        if b.out_view and b.out_view[0] != b.out_view[1]:
            out = {**out, "view": b.out_view}
        ops = [self.g.words(n) for n in order if n not in self.free_nodes(order)]
        spec.request = f"module group: {' -> '.join(ops)}"
        self.groups.append(Group(self.next_id, self.g.path, family, order, replaces, ops, spec.to_dict(),
                                 b.args, b.inputs, out, b.guards, b.notes))
        self.next_id += 1
        self.taken.update(order)

    def free_nodes(self, names: list[str]) -> set[str]:
        """Nodes that only select or view (getitem of a tuple, transposes): not ops to list."""
        free = set()
        for name in names:
            n = self.g.by_name[name]
            if n["target"] in (q(operator.getitem), "getattr", "transpose", "t") or n["target"] in TRANSPOSES \
                    or view_fusion.source(self.g, name) is not None:
                free.add(name)
        return free

    def _rows_group(self, name: str, a: Anchor) -> None:
        shape, dtype = self.g.tensor(a.x)
        inner = 1  # > 1: a strided reduction over a middle dim (params "inner")
        if a.family == "reduction" and a.dim is None:
            main_view, dims = {"view": "flat"}, {"M": 1, "N": math.prod(shape)}
        elif a.family == "reduction":
            lo, hi = (a.dim[0], a.dim[-1]) if isinstance(a.dim, list) else (a.dim, a.dim)  # a run of dims is one
            main_view = {"view": "rows", "contiguous": True}
            dims = {"M": math.prod(shape) // math.prod(shape[lo:hi + 1]), "N": math.prod(shape[lo:hi + 1])}
            if hi != len(shape) - 1:  # reduce in place over a middle dim: no transposed copy of x
                main_view = {"view": "strided", "dim": a.dim}
                inner = math.prod(shape[hi + 1:])
            elif lo != hi:   # the last few dims: rows of their product
                main_view = {"view": "strided", "dim": a.dim}
        else:
            main_view, dims = {"view": "rows", "contiguous": True}, {"M": math.prod(shape) // shape[-1], "N": shape[-1]}
            if a.family == "softmax" and a.dim is not None and a.dim != len(shape) - 1:  # in place, strided
                main_view, inner = {"view": "strided", "dim": a.dim}, math.prod(shape[a.dim + 1:])
                dims = {"M": math.prod(shape) // shape[a.dim], "N": shape[a.dim]}
        # vector operands run along the kernel's last dim: only when x's last dim stays last
        vector_ok = main_view == {"view": "rows", "contiguous": True}
        full = {"view": "like", "of": "main"}
        views = self.views_ok(name)
        links = self._walk_back(a.x, shape, dtype, full, vector_ok, views=views)
        b = _Builder(self.g, NodeRef(links[0][1]) if links else a.x, dtype)
        b.inputs.append({"arg": 0, **main_view})
        prologue = self._prologue(links, b, shape, full, vector_ok)
        prologue += a.pre
        b.nodes += [name, *a.covers]
        for v in a.vectors:
            if self._ref_tensor(v) != ([shape[-1]], dtype):
                self.why[name] = f"the {a.op} weight is not a [{shape[-1]}] {dtype} vector"
                return
            b.inputs.append({"arg": b.arg(v), "view": "vector"})
        epilogue, last = [], a.out
        if a.family != "reduction":
            epilogue, last = self._extend(a.out, b, shape, full, vector_ok, views=views)
        elif a.op not in ("argmax", "argmin"):   # operand-free steps on the reduced values
            epilogue, last = pointwise_fusion.reduction_epilogue(self, a.out, b, views)
            epilogue = a.post + epilogue
        params = dict(a.params)
        if inner > 1:
            params["inner"] = inner
        if prologue:
            params["prologue"] = prologue
        if epilogue:
            params["epilogue"] = epilogue
        out = {"kind": "reduced", "dim": a.dim, "keepdim": a.keepdim} if a.family == "reduction" else {"kind": "same"}
        self._finish(a.family, a.op, dims, params, b, out, a.replaces if last == a.out else [last])

    def _matmul_group(self, name: str, a: Anchor) -> None:
        sa, dtype = self.g.tensor(a.x)
        tb = self._ref_tensor(a.b)
        if tb is None or tb[1] != dtype:
            self.why[name] = "the weight's dtype differs from the input's"
            return
        sb = tb[0]
        n_dim, k_b = (sb[-2], sb[-1]) if a.b_nk else (sb[-1], sb[-2])
        if k_b != sa[-1]:
            self.why[name] = "inner dims do not match"
            return
        batched = a.op == "bmm"
        built = self._weighted(name, a, dtype, "batched" if batched else "rows", "batched" if batched else "as_is", n_dim)
        if built is None:
            return
        b, epilogue = built
        out_shape = [*sa[:-1], n_dim]
        more, last = self._extend(name, b, out_shape, {"view": "like", "of": "out"}, vector_ok=True,
                                  first=lambda node, running: pointwise_fusion.matmul_index_step(
                                      self, node, running, out_shape, batched))
        epilogue += more
        if batched:
            dims = {"B": math.prod(sa[:-2]), "M": sa[-2], "N": n_dim, "K": sa[-1]}
        else:
            dims = {"M": math.prod(sa[:-1]), "N": n_dim, "K": sa[-1]}
        params = {"b_layout": "nk" if a.b_nk else "kn", **({"epilogue": epilogue} if epilogue else {})}
        self._finish("matmul", a.op, dims, params, b, {"kind": "bmm" if batched else "matmul", "b_nk": a.b_nk},
                     [last])

    def _weighted(self, name: str, a: Anchor, dtype: str, x_view: str, w_view: str,
                  n: int) -> tuple[_Builder, list[dict]] | None:
        """The builder of a group around a weighted anchor (matmul, conv): its input and weight in
        these views, and its bias, an [n] vector, as the epilogue's first step; None (the reason
        noted) when the bias is not one."""
        b = _Builder(self.g, a.x, dtype)
        b.inputs += [{"arg": 0, "view": x_view}, {"arg": b.arg(a.b), "view": w_view}]
        b.nodes += [name, *a.covers]
        if a.bias is None:
            return b, []
        if self._ref_tensor(a.bias) != ([n], dtype):
            self.why[name] = f"the bias is not a [{n}] {dtype} vector"
            return None
        b.inputs.append({"arg": b.arg(a.bias), "view": "vector"})
        return b, [{"op": "bias"}]

    def _chain_group(self, name: str, s: Pointwise) -> None:
        out = self.g.tensor(name)
        if out is None or out[1] not in DTYPES or not out[0] or math.prod(out[0]) == 0:
            return
        shape, dtype = out
        full = {"view": "like", "of": "main"}
        for main in [r for r in s.inputs if isinstance(r, NodeRef) and self.g.tensor(r) == (shape, dtype)]:
            b = _Builder(self.g, main, dtype)
            b.inputs.append({"arg": 0, "view": "rows"})
            steps = self._step(name, main.name, b, shape, full, vector_ok=True)
            if steps is not None:
                break
        else:
            return
        b.nodes += [name, *s.covers]
        more, last = self._extend(name, b, shape, full, vector_ok=True)
        chain = steps + more
        if not chain:  # only no-ops (contiguous, dropout(p=0)): nothing to compute
            return
        self._finish("elementwise", "chain", {"M": math.prod(shape) // shape[-1], "N": shape[-1]},
                     {"chain": chain}, b, {"kind": "same"}, [last])

    def run(self) -> list[Group]:
        names = [n["name"] for n in self.g.nodes]
        self._rmsnorm_patterns()
        norm_fusion.normalization_patterns(self)   # x / norm(x), before the generic passes below
        self._silu_patterns()
        pointwise_fusion.collapse(self)   # formulas reading one value twice (hand-written hardswish)
        for plugin in PLUGINS:   # forms a plugin recognises across several nodes (a hand-written loss)
            getattr(plugin, "patterns", lambda p: None)(self)
        # a plugin's families' groups are its own to build (the anchor, its bias and pointwise tail)
        builds = {"matmul": self._matmul_group,
                  **{fam: (lambda n, a, plugin=plugin: plugin.build(self, n, a))
                     for plugin, fams in PLUGIN_FAMILIES.items() for fam in fams}}
        for name in names:  # anchors first, in graph order, each taking its prologue and epilogue
            a = self.sem.get(name)
            if isinstance(a, Anchor) and name in self.library and a.family in LIBRARY_FAMILIES:
                self.why[name] = self.library[name]
            elif isinstance(a, Anchor) and name not in self.taken:
                build = builds.get(a.family, self._rows_group)
                self._try_group(build, name, a)
        for name in names:  # then chains of what is left
            s = self.sem.get(name)
            if isinstance(s, Pointwise) and name not in self.taken:
                self._try_group(self._chain_group, name, s)
        return self.groups

    def _try_group(self, build, name: str, sem) -> None:
        """One group built around `name`; a failure leaves it to PyTorch with the reason."""
        try:
            try:
                build(name, sem)
            except view_fusion.Stranded as e:   # again, stopping at views
                self.no_views.add(name)
                made = len(self.groups)
                build(name, sem)
                if len(self.groups) > made:
                    self.groups[-1].notes.append(str(e))
        except Exception as e:
            self.why[name] = _not_analysed(e)

    def views_ok(self, anchor: str) -> bool:
        """Whether the group around `anchor` may read through pure views (module.view_fusion)."""
        return anchor not in self.no_views

    # -- a hand-written SiLU: x * sigmoid(x) -------------------------------------------------------
    def _silu_patterns(self) -> None:
        """x * sigmoid(x) (either order) is one silu step on x, so the chain through it stays
        one chain (x is not read twice) and a matmul takes it as its epilogue."""
        for n in self.g.nodes:
            m, s = n["name"], self.sem.get(n["name"])
            if not isinstance(s, Pointwise) or s.binop != "mul":
                continue
            for x, sig in (s.inputs, s.inputs[::-1]):
                sig_sem = self.sem.get(sig.name) if isinstance(sig, NodeRef) else None
                if (isinstance(x, NodeRef) and isinstance(sig_sem, Pointwise) and sig_sem.binop is None
                        and sig_sem.steps == [{"op": "sigmoid"}] and sig_sem.inputs[0] == x
                        and self.g.users[sig.name] == [m]
                        and self.g.tensor(sig) == self.g.tensor(x) == self.g.tensor(m)):
                    self.sem[m] = Pointwise([x], [{"op": "silu"}], covers=[sig.name])
                    del self.sem[sig.name]
                    self.why[sig.name] = "x * sigmoid(x) stays PyTorch with its multiply"
                    self.g.users[x.name].remove(sig.name)  # x is read by the silu alone
                    break

    # -- a hand-written RMSNorm: x * rsqrt(mean(x^2, -1, keepdim) + eps) [* weight] --------
    def _rmsnorm_patterns(self) -> None:
        for n in self.g.nodes:
            found = self._match_rmsnorm(n["name"])
            if found:
                self.sem[found.out] = found
                for c in found.covers:
                    self.sem.pop(c, None)

    def _is(self, name: str, kind: str) -> bool:
        n = self.g.by_name[name]
        return (n["op"] == "call_function" and n["target"] in {"rsqrt": RSQRT, "sqrt": SQRT}[kind]) or \
               (n["op"] == "call_method" and n["target"] == kind)

    def _match_rmsnorm(self, name: str) -> Anchor | None:
        """When `name` is the multiply by rsqrt(...) of a hand-written RMSNorm, the norm anchor
        (taking the weight multiply after it, if there is one)."""
        s = self.sem.get(name)
        if not isinstance(s, Pointwise) or s.binop != "mul":
            return None
        for x, r in (s.inputs, s.inputs[::-1]):
            if not (isinstance(x, NodeRef) and isinstance(r, NodeRef)) or not self._is(r.name, "rsqrt"):
                continue
            add = self.g.args(r.name)[0][0]
            add_sem = self.sem.get(add.name) if isinstance(add, NodeRef) else None
            if not isinstance(add_sem, Pointwise) or add_sem.binop != "add":
                continue
            var, eps = add_sem.inputs if isinstance(add_sem.inputs[0], NodeRef) else add_sem.inputs[::-1]
            mean = self.sem.get(var.name) if isinstance(var, NodeRef) else None
            if not (isinstance(mean, Anchor) and mean.family == "reduction" and mean.op == "mean" and mean.keepdim):
                continue
            xt = self.g.tensor(x)
            if xt is None or mean.dim != len(xt[0]) - 1 or self.g.number(eps) is None:
                continue
            sq = self.sem.get(mean.x.name)
            if not (isinstance(sq, Pointwise) and (sq.steps == [{"op": "square"}] and sq.inputs[0] == x
                                                   or sq.binop == "mul" and sq.inputs == [x, x])):
                continue
            inner = [mean.x.name, var.name, add.name, r.name]
            if any(len(self.g.users[i]) != 1 for i in inner) or isinstance(eps, NodeRef):
                continue
            anchor = Anchor("norm", "rmsnorm", x, params={"eps": self.g.number(eps), "affine": False},
                            covers=inner, out=name, replaces=[name])
            w_user = self._single_user(name)
            w_sem = self.sem.get(w_user) if w_user else None
            if isinstance(w_sem, Pointwise) and w_sem.binop == "mul" and w_sem.inputs.count(NodeRef(name)) == 1:
                w = next(v for v in w_sem.inputs if v != NodeRef(name))
                if isinstance(w, NodeRef) and self.g.tensor(w) == ([xt[0][-1]], xt[1]):
                    anchor.params["affine"], anchor.vectors = True, [w]
                    anchor.covers = [*inner, name]
                    anchor.out, anchor.replaces = w_user, [w_user]
            return anchor
        return None

    def _makes_tensors(self, name: str) -> bool:
        """The node produced a tensor, or a tuple holding one (an LSTM's (out, (h, c)))."""
        def has(v) -> bool:
            return isinstance(v, dict) and ("tensor" in v or any(has(x) for x in v.get("seq", [])))
        return has(self.g.by_name[name]["value"])

    def _indexes_by_tensor(self, name: str) -> bool:
        """x[idx] with a tensor idx: a gather, not a view."""
        n = self.g.by_name[name]
        if n["target"] != q(operator.getitem):
            return False
        args, _ = self.g.args(name)
        index = args[1] if len(args) > 1 else None
        parts = index if isinstance(index, (tuple, list)) else (index,)
        return any(isinstance(p, NodeRef) and self.g.tensor(p) is not None for p in parts)

    def _broadcast_both(self, name: str) -> str | None:
        """Why a two-tensor pointwise op with no operand of the result's shape stays PyTorch
        (Mamba2's segsum x[..., :, None] - x[..., None, :], an outer difference)."""
        s = self.sem.get(name)
        if not isinstance(s, Pointwise) or s.binop is None or self.g.tensor(name) is None:
            return None
        shape = self.g.tensor(name)[0]
        refs = [r for r in s.inputs if isinstance(r, NodeRef) and self.g.tensor(r) is not None]
        if len(refs) == 2 and all(self.g.tensor(r)[0] != shape for r in refs):
            return ("both operands are broadcast to a larger result (an outer sum or difference): a pointwise "
                    "kernel here starts from a tensor of the result's shape; not done yet")
        return None

    def torch_ops(self) -> list[dict]:
        """Nodes left to PyTorch that compute something (views, sizes and selections are free)."""
        free = {"view", "reshape", "permute", "transpose", "contiguous", "flatten", "unsqueeze", "squeeze",
                "expand", "t", "size", "dim", "chunk", "split", "unbind", "getitem", "getattr", "type_as",
                "expand_as", "view_as", "reshape_as", "unfold", "narrow", "movedim", "moveaxis", "unflatten",
                "swapaxes", "swapdims", "select", "diagonal"}
        left = []
        for n in self.g.nodes:
            name = n["name"]
            if name in self.taken or name in self.dropped or n["op"] in ("placeholder", "output", "get_attr") \
                    or not self._makes_tensors(name):
                continue
            gather = self._indexes_by_tensor(name)
            # Tensor.unfold is a view; F.unfold (im2col) computes
            if n["target"].rsplit(".", 1)[-1].rstrip("_") in free and not gather \
                    and n["target"] != "torch.nn.functional.unfold":
                continue
            known = _LEFT_WHY.get(n["target"].rsplit(".", 1)[-1].rstrip("_"))
            why = self.why.get(name) or ("indexing by a tensor (a gather) is outside the kernel catalog" if gather
                                         else known if known
                                         else "outside the kernel catalog" if name not in self.sem
                                         else self._broadcast_both(name) or "nothing to fuse it with")
            left.append({"node": name, "graph": self.g.path, "op": self.g.words(name), "why": why})
        return left


# ops left to PyTorch on purpose, and why in words (not "outside the catalog": no kernel of ours
# would do better, so the LLM coder is not asked for one either)
_LEFT_WHY = {
    # tensors made from nothing but a shape and a value (the graph stage's x - x -> zeros makes one)
    **dict.fromkeys(("zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like",
                     "new_zeros", "new_ones", "new_full", "new_empty"),
                    "a constant fill: nothing to compute, PyTorch writes it"),
    # torch.tensor(number) in a forward: the kernels that read it take the number itself
    "tensor": "a constant made from Python numbers: nothing to compute; a kernel reading it takes the number",
    # the graph stage's tap windows (conv_positions): a small 0/1 matrix copied to the GPU
    "new_tensor": "a small constant made from Python numbers (a moved reduction's tap windows): nothing to compute",
    # DenseNet's 58 concatenations: a copy each; only producers writing into its slices would save it
    **dict.fromkeys(("cat", "concat", "concatenate", "stack", "hstack", "vstack"),
                    "a concatenation: a copy at memory speed, as torch.cat does it; writing its inputs' "
                    "producers straight into its slices is not done yet"),
    "pad": "a pad: a copy at memory speed, as PyTorch does it; folding it into the next kernel's bounds is "
           "not done yet",
    # minGPT's causal mask (bias[:, :, :T, :T] == 0): a small boolean tensor the kernel reading it loads
    **dict.fromkeys(("eq", "ne", "lt", "le", "gt", "ge", "logical_not", "invert", "bitwise_not"),
                    "a comparison making a boolean mask: PyTorch computes it and the kernel that reads the "
                    "mask loads it; folding it into that kernel is not done yet"),
    # einops: a view, or a copy at memory speed where the layout needs one
    "rearrange": "a layout change (einops): a view, or a copy at memory speed as PyTorch makes it",
    # random draws stay PyTorch's so that ModelNew draws the very numbers Model draws
    **dict.fromkeys(("rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli",
                     "normal", "multinomial", "randperm"),
                    "random numbers: PyTorch's generator draws them, so ModelNew draws what Model draws"),
}


def _not_analysed(e: Exception) -> str:
    return f"not analysed: the partitioner failed on it ({type(e).__name__}: {str(e)[:200]})"


@dataclass
class Partition:
    groups: list[Group]
    torch_ops: list[dict]

    def to_dict(self) -> dict:
        return {"groups": [g.to_dict() for g in self.groups], "torch_ops": self.torch_ops}


def partition(captured: dict, library: dict[str, dict[str, str]] | None = None) -> Partition:
    """Fusion groups of every captured graph (module.capture's result), ids unique across them.
    library: per graph path, anchors left to PyTorch's library kernels (node name -> why)."""
    groups, left = [], []
    for desc in captured["graphs"]:
        p = Partitioner(desc, first_id=len(groups), library=(library or {}).get(desc.get("path", "")))
        groups += p.run()
        left += p.torch_ops()
    return Partition(groups, left)
