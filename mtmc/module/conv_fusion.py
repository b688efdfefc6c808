"""Convolutions in a captured graph: classifying them, and building conv groups with the
pointwise tail after them as the kernel's epilogue.

nn.Conv1d/2d/3d and nn.ConvTranspose1d/2d/3d modules and the F.conv* / F.conv_transpose*
functions become "conv" anchors (module.fx_ops asks here).  A group takes the conv, its bias,
and the pointwise ops that follow while each value has one user: scalars, full tensors of the
output's shape (a residual), and per-channel operands ([C, 1, 1], [1, C, 1, 1], ...: a bias or
scale parameter), which the kernel reads as [C_out] vectors instead of expanding them.  The
weights and bias stay the module's parameters, so ModelNew still takes Model's state_dict.
"""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from mtmc.kernels.families.conv import conv_spec, is_transposed, out_names, rank
from mtmc.module.fx_ops import Anchor, NodeRef, Pointwise, Reject, _arg, _cls, q
from mtmc.kernels.spec import DTYPES

CONV_FUNCTIONS = {q(f): f.__name__ for f in (F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d,
                                               F.conv_transpose2d, F.conv_transpose3d)}
CONV_MODULES = {_cls(c): op for c, op in [
    (nn.Conv1d, "conv1d"), (nn.Conv2d, "conv2d"), (nn.Conv3d, "conv3d"), (nn.ConvTranspose1d, "conv_transpose1d"),
    (nn.ConvTranspose2d, "conv_transpose2d"), (nn.ConvTranspose3d, "conv_transpose3d")]}
CHANNEL_BINOPS = {"add", "sub", "mul", "maximum", "minimum"}


# -- classifying ----------------------------------------------------------------------------------

def _ints(v, r: int, what: str) -> list[int]:
    vals = [v] * r if isinstance(v, int) else list(v) if isinstance(v, (list, tuple)) else None
    if vals is None or len(vals) != r or not all(isinstance(x, int) and not isinstance(x, bool) for x in vals):
        raise Reject(f"a conv {what} of {v!r} is not a constant per dim")
    return vals


def _padding(v, r: int, kernel: list[int], dilation: list[int]) -> list[list[int]]:
    if v == "valid":
        return [[0, 0]] * r
    if v == "same":   # PyTorch pads the extra one on the right
        return [[d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2] for k, d in zip(kernel, dilation)]
    return [[p, p] for p in _ints(v, r, "padding")]


def _anchor(c, name: str, op: str, x, weight, bias, weight_shape, stride, padding, dilation, groups,
            output_padding, padding_mode: str = "zeros") -> Anchor:
    r = rank(op)
    shape, dtype = c._float_tensor(x, "the conv input")
    if len(shape) != r + 2:
        raise Reject(f"{op} of an unbatched input (shape {shape})")
    if isinstance(weight, NodeRef):
        weight_shape, dw = c._float_tensor(weight, "the conv weight")
        if dw != dtype:
            raise Reject(f"mixed dtypes {dtype} and {dw}")
    if weight_shape is None or len(weight_shape) != r + 2:
        raise Reject("the conv weight's shape is unknown")
    if not isinstance(groups, int) or isinstance(groups, bool):
        raise Reject("a computed number of groups is not fused")
    kernel = list(weight_shape[2:])
    dil = _ints(dilation, r, "dilation")
    params = {"stride": _ints(stride, r, "stride"), "padding": _padding(padding, r, kernel, dil), "dilation": dil,
              "groups": groups}
    if is_transposed(op):
        params["output_padding"] = _ints(output_padding, r, "output_padding")
    if padding_mode != "zeros":   # reflect / replicate / circular: remapped in the kernel's gather
        params["padding_mode"] = padding_mode
    return Anchor("conv", op, x, params=params, b=weight, bias=bias, out=name, replaces=[name])


def classify_call(c, name: str, fn: str | None, args: tuple, kwargs: dict) -> Anchor | None:
    """A conv anchor for an F.conv* call, None for any other function."""
    op = CONV_FUNCTIONS.get(fn)
    if op is None:
        return None
    x, w, bias = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight"), _arg(args, kwargs, 2, "bias")
    if is_transposed(op):
        stride, padding, opad = (_arg(args, kwargs, i, k, 1 if k == "stride" else 0)
                                 for i, k in ((3, "stride"), (4, "padding"), (5, "output_padding")))
        groups, dilation = _arg(args, kwargs, 6, "groups", 1), _arg(args, kwargs, 7, "dilation", 1)
    else:
        stride, padding = _arg(args, kwargs, 3, "stride", 1), _arg(args, kwargs, 4, "padding", 0)
        dilation, groups, opad = _arg(args, kwargs, 5, "dilation", 1), _arg(args, kwargs, 6, "groups", 1), 0
    if not isinstance(w, NodeRef):
        raise Reject("the conv weight is not a tensor of the graph")
    return _anchor(c, name, op, x, w, bias, None, stride, padding, dilation, groups, opad)


def classify_module(c, name: str, target: str, info: dict, x) -> Anchor | None:
    """A conv anchor for an nn.Conv*d / nn.ConvTranspose*d call, None for any other module."""
    op = CONV_MODULES.get(info.get("type", ""))
    if op is None:
        return None
    attrs, params = info.get("attrs", {}), info.get("params", {})
    if "weight" not in params:
        raise Reject("the conv module has no weight parameter")
    bias = {"attr": f"{target}.bias"} if "bias" in params else None
    return _anchor(c, name, op, x, {"attr": f"{target}.weight"}, bias, params["weight"]["shape"],
                   attrs.get("stride", 1), attrs.get("padding", 0), attrs.get("dilation", 1), attrs.get("groups", 1),
                   attrs.get("output_padding", 0), attrs.get("padding_mode", "zeros"))


# -- building the group -----------------------------------------------------------------------------

def _is_channel_operand(oshape: list[int], full: list[int]) -> bool:
    """An operand that broadcasts over everything but the channel dim (dim 1) of `full`."""
    if len(oshape) > len(full) or oshape == full:
        return False
    o = [1] * (len(full) - len(oshape)) + list(oshape)
    return o[1] == full[1] and all(v == 1 for i, v in enumerate(o) if i != 1)


def _channel_step(p, node: str, running: str, b, full: list[int]) -> list[dict] | None:
    """Steps for `node` = running (op) a per-channel tensor, its operand a [C_out] kernel input."""
    s = p.sem.get(node)
    if not isinstance(s, Pointwise) or s.binop not in CHANNEL_BINOPS or node in p.taken or node in b.nodes:
        return None
    if p.g.tensor(node) != (full, b.dtype) or NodeRef(running) not in s.inputs:
        return None
    first = s.inputs[0] == NodeRef(running)
    other = s.inputs[1] if first else s.inputs[0]
    t = p.g.tensor(other) if isinstance(other, NodeRef) else None
    if t is None or other.name in b.nodes or t[1] != b.dtype or not _is_channel_operand(t[0], full):
        return None
    b.inputs.append({"arg": b.arg(other), "view": "vector"})
    if s.binop == "add":
        return [{"op": "bias"}]
    if s.binop == "sub":
        return [{"op": "sub", "channel": True}] if first else [{"op": "neg"}, {"op": "bias"}]
    return [{"op": s.binop, "channel": True}]


def build(p, name: str, a: Anchor) -> None:
    """The conv group around anchor `a` (a Partitioner's method in all but name)."""
    shape, dtype = p.g.tensor(a.x)
    tw = p._ref_tensor(a.b)
    if tw is None or tw[1] != dtype or dtype not in DTYPES:
        p.why[name] = "the conv weight's dtype differs from the input's"
        return
    groups = a.params["groups"]
    c_out = tw[0][1] * groups if is_transposed(a.op) else tw[0][0]
    spec = conv_spec(a.op, shape, c_out, tw[0][2:], dtype=dtype, **a.params)
    out = p.g.tensor(name)
    want = [shape[0], c_out, *(spec.dims[o] for o in out_names(a.op))]
    if out is None or out[0] != want:
        p.why[name] = f"the conv's output shape {out and out[0]} is not the {want} its parameters give"
        return
    built = p._weighted(name, a, dtype, "as_is", "as_is", c_out)   # the kernel reads x and w through strides
    if built is None:
        return
    b, epilogue = built
    # the tail: per-channel operands as [C_out] vectors, else scalars and full-shape operands
    more, last = p._extend(name, b, want, {"view": "like", "of": "out"}, False,
                           first=lambda node, running: _channel_step(p, node, running, b, want))
    params = dict(spec.params)
    if epilogue + more:
        params["epilogue"] = epilogue + more
    r = rank(a.op)
    geometry = [[k, s, lo, hi, d, o] for k, s, (lo, hi), d, o in zip(
        params["kernel"], params["stride"], params["padding"], params["dilation"],
        params.get("output_padding") or [0] * r)]
    p._finish("conv", a.op, spec.dims, params, b,
              {"kind": "conv", "c_out": c_out, "transposed": is_transposed(a.op), "geometry": geometry}, [last])


def out_shape_source(out: dict, x: str) -> str:
    """Python source of the output shape of a conv group's kernel for input `x` (the wrapper's)."""
    sizes = [f"{x}.shape[0]", str(out["c_out"])]
    for i, (k, s, lo, hi, d, o) in enumerate(out["geometry"]):
        size = f"{x}.shape[{2 + i}]"
        if out["transposed"]:
            sizes.append(f"({size} - 1) * {s} - {lo + hi} + {d * (k - 1) + o + 1}")
        else:
            sizes.append(f"({size} + {lo + hi - d * (k - 1) - 1}) // {s} + 1")
    return "(" + ", ".join(sizes) + ")"
