"""The activations and pointwise math of a captured graph beyond relu/gelu/silu: which torch
functions, tensor methods and nn modules they are, and the pointwise steps (kernels.pointwise)
each becomes with its arguments read as PyTorch defines them.

module.fx_ops merges the maps below into its own and asks `call_steps` / `module_steps` for the
steps of the ops that take parameters (ELU's alpha, Softplus's beta and threshold, tril's
diagonal, pow's exponent).  A parameter that is not a plain number raises ValueError with the
reason, which fx_ops reports as a Reject.  Plain data and torch only: no graph types here.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtmc.kernels import pointwise
from mtmc.module.fxjson import target_name


def _cls(c) -> str:
    return f"{c.__module__}.{c.__qualname__}"


# function -> op; in-place twins (torch.relu_, F.elu_) are listed in INPLACE_FUNCTIONS too.
FUNCTIONS = {target_name(f): op for f, op in [
    (F.elu, "elu"), (F.elu_, "elu"), (F.selu, "selu"), (torch.selu, "selu"), (torch.selu_, "selu"),
    (F.celu, "celu"), (torch.celu, "celu"), (torch.celu_, "celu"), (F.hardsigmoid, "hardsigmoid"),
    (F.hardswish, "hardswish"), (F.softplus, "softplus"), (F.softsign, "softsign"), (F.mish, "mish"),
    (F.logsigmoid, "log_sigmoid"), (torch.log, "log"), (torch.sqrt, "sqrt"), (torch.rsqrt, "rsqrt"),
    (torch.reciprocal, "reciprocal"), (torch.sign, "sign"), (torch.erf, "erf"), (torch.special.erf, "erf"),
    (torch.special.expit, "sigmoid"), (torch.tril, "tril"), (torch.triu, "triu"), (torch.relu_, "relu"),
    (torch.sigmoid_, "sigmoid"), (torch.tanh_, "tanh"), (F.hardtanh_, "hardtanh"), (F.leaky_relu_, "leaky_relu"),
    (F.tanhshrink, "tanhshrink"), (F.softshrink, "softshrink"), (F.hardshrink, "hardshrink"),
    (torch.hardshrink, "hardshrink"), (F.threshold, "threshold"), (torch.threshold, "threshold"), (F.rrelu, "rrelu"),
]}
INPLACE_FUNCTIONS = {target_name(f) for f in (F.elu_, torch.selu_, torch.celu_, torch.relu_, torch.sigmoid_,
                                              torch.tanh_, F.hardtanh_, F.leaky_relu_)}
METHODS = {m: m for m in ("log", "sqrt", "rsqrt", "reciprocal", "sign", "erf", "tril", "triu", "hardshrink")}
MODULES = {_cls(c): op for c, op in [
    (nn.ELU, "elu"), (nn.SELU, "selu"), (nn.CELU, "celu"), (nn.Hardsigmoid, "hardsigmoid"),
    (nn.Hardswish, "hardswish"), (nn.Softplus, "softplus"), (nn.Softsign, "softsign"), (nn.Mish, "mish"),
    (nn.LogSigmoid, "log_sigmoid"), (nn.Tanhshrink, "tanhshrink"), (nn.Softshrink, "softshrink"),
    (nn.Hardshrink, "hardshrink"), (nn.Threshold, "threshold"), (nn.RReLU, "rrelu"),
]}
# ops whose steps depend on their arguments: (positional index, keyword, default) per parameter
PARAMS = {"elu": [(1, "alpha", 1.0)], "celu": [(1, "alpha", 1.0)],
          "softplus": [(1, "beta", 1.0), (2, "threshold", 20.0)],
          "tril": [(1, "diagonal", 0)], "triu": [(1, "diagonal", 0)],
          # the shrinks, threshold and rrelu are written with the catalog's steps (select, fork, leaky_relu)
          "tanhshrink": [], "softshrink": [(1, "lambd", 0.5)], "hardshrink": [(1, "lambd", 0.5)],
          "threshold": [(1, "threshold", None), (2, "value", None)],
          "rrelu": [(1, "lower", 1.0 / 8), (2, "upper", 1.0 / 3), (3, "training", False)]}


def _number(v, what: str) -> float:
    if isinstance(v, bool) and what.endswith("training"):
        return float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{what} that is not a plain number is not fused")
    return float(v)


def _steps(op: str, values: list[float]) -> list[dict]:
    if op in pointwise.WRITTEN:   # the shrinks and threshold: select and fork steps
        return pointwise.written_steps(op, *values)
    if op == "rrelu":        # in eval mode the slope is fixed: (lower + upper) / 2
        lower, upper, training = values
        if training:
            raise ValueError("rrelu in training mode draws a random slope per element; it stays PyTorch")
        return [{"op": "leaky_relu", "value": (lower + upper) / 2}]
    if op == "softplus":
        beta, threshold = values
        return [{"op": "softplus", "value": beta, **({"threshold": threshold} if threshold != 20.0 else {})}]
    if op in ("elu", "celu") and values[0] == 0:
        raise ValueError(f"{op} with alpha 0 is undefined")
    return [{"op": op, "value": values[0]}]


def call_steps(op: str, args: tuple, kwargs: dict) -> list[dict]:
    """Steps of a function or method call of `op` (args[0] is the input)."""
    values = []
    for i, key, default in PARAMS[op]:
        v = kwargs[key] if key in kwargs else args[i] if len(args) > i else default
        values.append(_number(v, f"{op}'s {key}"))
    return _steps(op, values)


def module_steps(op: str, attrs: dict) -> list[dict]:
    """Steps of an nn module of `op`, from its captured attributes."""
    return _steps(op, [_number(attrs.get(key, default), f"{op}'s {key}") for _, key, default in PARAMS[op]])


def pow_steps(exponent) -> list[dict]:
    """x ** exponent for a plain number: square for 2 (the common case, one multiply)."""
    e = _number(exponent, "an exponent")
    return [{"op": "square"}] if e == 2.0 else [{"op": "pow", "value": e}]


def reduced_dims(op: str, dim, ndim: int):
    """A reduction's dim argument as the reduction groups take it: an int, a list of neighbouring
    dims (a kernel reduces them as one: x.sum(dim=(2, 3))), or None for every dim.  ValueError
    says why other forms are not fused (fx_ops reports it as a Reject)."""
    if dim is None:
        return None
    dims = list(dim) if isinstance(dim, (tuple, list)) else [dim]
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise ValueError(f"{op} over a computed or empty dim list is not fused")
    dims = sorted({d % ndim for d in dims})
    if dims != list(range(dims[0], dims[-1] + 1)):
        raise ValueError(f"{op} over dims {dims} that are not next to each other is not fused")
    if len(dims) == ndim:
        return None
    return dims[0] if len(dims) == 1 else dims
