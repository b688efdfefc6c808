"""Pooling in a captured graph: classifying it, and building pool groups with the pointwise tail
after them as the kernel's epilogue.

nn.MaxPool1d/2d/3d, nn.AvgPool*, nn.AdaptiveMaxPool*, nn.AdaptiveAvgPool* modules and the
F.max_pool* / F.avg_pool* / F.adaptive_* functions (and their torch.* and *_with_indices twins)
become "pool" anchors (module.fx_ops asks here).  A group takes the pool and the pointwise ops
that follow while each value has one user: scalars, full tensors of the output's shape and
per-channel operands ([C, 1, 1] ...), read as [C] vectors as the conv groups read them.  A max
pool whose indices are used (return_indices) becomes a group of the indices alone when its
values are unused; both used stays PyTorch with the reason.  The global pool written as a mean
over the spatial dims is a reduction (module.fusion's rows groups), not this.
"""
from __future__ import annotations

import operator

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtmc.kernels.families._conv_geometry import out_names
from mtmc.kernels.families.pool import is_adaptive, is_max, pool_spec
from mtmc.kernels.spec import DTYPES
from mtmc.module.conv_fusion import _channel_step
from mtmc.module.fx_ops import Anchor, NodeRef, Reject, _arg, _cls, q

# (op, the positional names after the input, whether it always returns (values, indices))
_SIGNATURES = {
    "max": ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"),
    "avg": ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"),
    "adaptive_max": ("output_size", "return_indices"),
    "adaptive_avg": ("output_size",),
}


def _functions() -> dict[str, tuple[str, bool]]:
    """Qualified name -> (op, returns indices always) for every function spelling of a pool."""
    table = {}
    for r in (1, 2, 3):
        for kind in ("max", "avg", "adaptive_max", "adaptive_avg"):
            op = f"{kind}_pool{r}d"
            for owner in (F, torch, torch._C._nn):
                for name, pair in ((op, False), (f"{op}_with_indices", True)):
                    fn = getattr(owner, name, None)
                    if fn is not None and callable(fn):
                        # torch.adaptive_max_pool1d returns (values, indices) like the _with_indices ones
                        always = pair or (owner is torch and kind == "adaptive_max")
                        table.setdefault(q(fn), (op, always))
    return table


POOL_FUNCTIONS = _functions()
POOL_MODULES = {_cls(getattr(nn, f"{m}{r}d")): f"{k}_pool{r}d" for r in (1, 2, 3) for m, k in (
    ("MaxPool", "max"), ("AvgPool", "avg"), ("AdaptiveMaxPool", "adaptive_max"), ("AdaptiveAvgPool", "adaptive_avg"))}


# -- classifying ----------------------------------------------------------------------------------

def _anchor(c, name: str, op: str, x, settings: dict, always_pair: bool) -> Anchor:
    shape, dtype = c._float_tensor(x, "the pool input")
    r = int(op[-2])
    if len(shape) != r + 2:
        raise Reject(f"{op} of an input without a batch dim (shape {shape}); the kernels take [N, C, ...]")
    for key, v in settings.items():
        if isinstance(v, NodeRef) or (isinstance(v, (list, tuple)) and any(isinstance(e, NodeRef) for e in v)):
            raise Reject(f"a pool {key} computed at run time is not fused")
    if settings.get("padding") == "same" or isinstance(settings.get("padding"), str):
        raise Reject("a pool padding given as a string is not fused")
    anchor = Anchor("pool", op, x, params=dict(settings), out=name, replaces=[name])
    returns_pair = always_pair or bool(settings.get("return_indices"))
    anchor.params.pop("return_indices", None)
    if returns_pair:
        _pick_output(c, name, anchor)
    return anchor


def _pick_output(c, name: str, anchor: Anchor) -> None:
    """(values, indices): the group computes whichever one is used (indices: params "indices")."""
    values, indices, unused = [], [], []
    for u in c.g.users[name]:
        if not c.g.users[u]:
            unused.append(u)
            continue
        n = c.g.by_name[u]
        args, _ = c.g.args(u)
        which = args[1] if n["op"] == "call_function" and n["target"] == q(operator.getitem) else None
        (values if which == 0 else indices if which == 1 else [None]).append(u)
    if None in values or None in indices:
        raise Reject("a pool whose (values, indices) pair is used whole is not fused")
    if values and indices:
        raise Reject("a max pool whose values and indices are both used stays PyTorch (the kernel returns one)")
    if not (values or indices):
        raise Reject("a pool whose results are unused")
    anchor.params["indices"] = bool(indices)
    anchor.covers, anchor.replaces = values + indices + unused, values + indices
    anchor.out = (values + indices)[-1]


def classify_call(c, name: str, fn: str | None, args: tuple, kwargs: dict) -> Anchor | None:
    """A pool anchor for a pooling function, None for any other function."""
    found = POOL_FUNCTIONS.get(fn)
    if found is None:
        return None
    op, always_pair = found
    names = _SIGNATURES[op.rsplit("_pool", 1)[0]]
    settings = {}
    for i, key in enumerate(names):
        v = _arg(args, kwargs, i + 1, key)
        if v is not None:
            settings[key] = v
    if "stride" in settings and settings["stride"] in ([], ()):   # torch.max_pool2d's default
        del settings["stride"]
    return _anchor(c, name, op, _arg(args, kwargs, 0, "input"), settings, always_pair)


def classify_module(c, name: str, target: str, info: dict, x) -> Anchor | None:
    """A pool anchor for an nn pooling module, None for any other module."""
    op = POOL_MODULES.get(info.get("type", ""))
    if op is None:
        return None
    attrs = info.get("attrs", {})
    names = _SIGNATURES[op.rsplit("_pool", 1)[0]]
    settings = {k: attrs[k] for k in names if attrs.get(k) is not None}
    return _anchor(c, name, op, x, settings, False)


# -- building the group -----------------------------------------------------------------------------

def _spec(a: Anchor, shape: list[int], dtype: str):
    s = a.params
    if is_adaptive(a.op):
        size = s.get("output_size")
        return pool_spec(a.op, shape, output_size=size, indices=s.get("indices", False), dtype=dtype)
    kw = {k: s[k] for k in ("stride", "padding", "ceil_mode") if k in s}
    if is_max(a.op):
        kw.update({k: s[k] for k in ("dilation",) if k in s})
        kw["indices"] = s.get("indices", False)
    else:
        kw.update({k: s[k] for k in ("count_include_pad", "divisor_override") if k in s})
    return pool_spec(a.op, shape, kernel=s["kernel_size"], dtype=dtype, **kw)


def build(p, name: str, a: Anchor) -> None:
    """The pool group around anchor `a` (a Partitioner's method in all but name)."""
    shape, dtype = p.g.tensor(a.x)
    if dtype not in DTYPES:
        p.why[name] = f"the pool input is {dtype}; kernels take {', '.join(DTYPES)}"
        return
    try:
        spec = _spec(a, shape, dtype)
    except (ValueError, TypeError) as e:
        p.why[name] = f"the pool's settings are not servable: {e}"
        return
    want = [shape[0], shape[1], *(spec.dims[o] for o in out_names(a.op))]
    out = p.g.tensor(a.out)
    if out is None or out[0] != want:
        p.why[name] = f"the pool's output shape {out and out[0]} is not the {want} its parameters give"
        return
    # the operand-free activation before the pool (a library conv's, after regroup) runs on its loads
    b, prologue = p.free_prologue(a.x, shape, dtype)
    b.inputs.append({"arg": 0, "view": "as_is"})   # the kernel reads x through its strides
    b.nodes += [name, *a.covers]
    params = dict(spec.params, **({"prologue": prologue} if prologue else {}))
    last = a.out
    if not params.get("indices"):
        more, last = p._extend(a.out, b, want, {"view": "like", "of": "out"}, False,
                               first=lambda node, running: _channel_step(p, node, running, b, want))
        if more:
            params["epilogue"] = more
    p._finish("pool", a.op, spec.dims, params, b, {"kind": "pool", "sizes": [spec.dims[o] for o in out_names(a.op)],
                                                    "window": _window(spec)}, [last] if last != a.out else a.replaces)


def _window(spec) -> list[list] | None:
    """Per dim [k, s, pad, dilation, ceil_mode] of a fixed window (None: adaptive, fixed sizes)."""
    if is_adaptive(spec.op):
        return None
    p = spec.params
    dil = p.get("dilation") or [1] * len(p["kernel"])
    return [[k, s, pad, d, bool(p.get("ceil_mode"))] for k, s, pad, d in zip(p["kernel"], p["stride"], p["padding"], dil)]


def out_shape_source(out: dict, x: str) -> str:
    """Python source of a pool group's output shape for input `x` (the wrapper's)."""
    sizes = [f"{x}.shape[0]", f"{x}.shape[1]"]
    if out["window"] is None:
        return "(" + ", ".join(sizes + [str(s) for s in out["sizes"]]) + ")"
    for i, (k, s, pad, d, ceil) in enumerate(out["window"]):
        size = f"{x}.shape[{2 + i}]"
        if not ceil:
            sizes.append(f"({size} + {2 * pad - d * (k - 1) - 1}) // {s} + 1")
        else:   # PyTorch's ceil mode: one more window unless it would start past the padded input
            o = f"(({size} + {2 * pad - d * (k - 1) - 1 + s - 1}) // {s} + 1)"
            sizes.append(f"{o} - ((({o} - 1) * {s}) >= {size} + {pad})")
    return "(" + ", ".join(sizes) + ")"
