"""Losses: one kernel for the per-item loss values and a tiny deterministic second pass for the
final mean or sum.

Spec: dims M, N.  params "reduction": "mean" (default) | "sum" | "none" | "batchmean" (kl_div).
Elementwise losses read x and y [M, N] as one flat run of M * N elements (M is the batch, dim 0):
  mse, l1, smooth_l1 (params "beta", default 1), huber ("delta", default 1), kl_div (x holds
  log-probabilities, or probabilities with "log_input"; "log_target"), hinge_embedding (y is +-1,
  "margin", default 1), and total: the sum or mean of a pointwise "prologue" chain of x and its
  operands (torch.mean(torch.clamp(1 - pred * target, min=0)), torch.mean((a - b) ** 2)).
Row losses reduce each row of N values to one value first:
  cross_entropy (x [M, N] logits, target [M] int64 class indices, "ignore_index" default -100,
  "label_smoothing" default 0),
  triplet_margin (anchor, positive, negative [M, N]; "margin" 1, "p" 2, "eps" 1e-6, "swap"),
  cosine_similarity (x1, x2 [M, N]; "eps" 1e-8), cosine_embedding (x1, x2 [M, N], y [M] +-1;
  "margin" 0); a row loss's values may go through an "epilogue" chain without operands
  (1 - cosine_similarity) before the reduction.
Output: [M, N] (elementwise, "none"), [M] (row loss, "none"), else a 0-d tensor.

How: pass 1 has each program accumulate its items in fp32 (elementwise: a grid of a few programs
per SM striding over BLOCK-element chunks; rows: ROWS_PER_PROG rows per program, their columns in
BLOCK_N chunks) and write one partial sum (cross_entropy: and a count of rows not ignored); pass
2 is one program adding the partials in a fixed order and dividing.  No atomics, so the result
is the same on every run.
"""
from __future__ import annotations

import math

from mtmc.kernels import pointwise
from mtmc.kernels.families import _rows
from mtmc.kernels.families.elementwise import indent, signature, step_lines
from mtmc.kernels.families._loss_render import (
    BLOCKS, PARAMS, REDUCTIONS, TORCH_NAMES, WAVES, is_rowwise, param, reduction, render,
)
from mtmc.kernels.family import CPU_SMS, DTYPE_BYTES, Family, TensorArg, small_dim
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import DTYPES, KernelSpec

class LossFamily(Family):
    name = "loss"
    ops = FAMILY_OPS["loss"]

    # -- what --
    def describe(self, spec: KernelSpec) -> str:
        d = spec.dims
        extra = [f"{k}={v}" for k, v in spec.params.items() if k not in ("reduction", "prologue", "epilogue")]
        chain = [f"of {pointwise.describe_chain(spec.params['prologue'])}"] if spec.params.get("prologue") else []
        chain += [f"then {pointwise.describe_chain(spec.params['epilogue'])}"] if spec.params.get("epilogue") else []
        what = "rows of " if is_rowwise(spec) else ""
        return (f"{spec.op} loss ({reduction(spec)}) over {what}{d['M']}x{d['N']} {spec.dtype}"
                + "".join(f", {w}" for w in [*extra, *chain]))

    def validate(self, spec: KernelSpec) -> None:
        super().validate(spec)
        if set(spec.dims) != {"M", "N"} or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                               for v in spec.dims.values()):
            raise ValueError(f"a loss takes positive dims M (batch rows) and N (values per row); got {spec.dims}")
        if spec.dtype not in DTYPES:
            raise ValueError(f"dtype {spec.dtype!r} is not supported; use one of {', '.join(DTYPES)}")
        known = {"reduction", *PARAMS[spec.op]}
        unknown = set(spec.params) - known
        if unknown:
            raise ValueError(f"the {spec.op} loss does not take {sorted(unknown)}; it takes {sorted(known)}")
        red = reduction(spec)
        if red not in REDUCTIONS or (red == "batchmean" and spec.op != "kl_div"):
            raise ValueError(f"reduction {red!r} is not one of mean, sum, none (batchmean: kl_div only)")
        if spec.op == "total" and red not in ("mean", "sum"):
            raise ValueError("a total is a mean or a sum")
        for key, default in PARAMS[spec.op].items():
            value = param(spec, key)
            if isinstance(default, bool) and not isinstance(value, bool):
                raise ValueError(f"params {key!r} must be true or false, got {value!r}")
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                _rows.number_param(spec, key, default)
        if spec.op == "smooth_l1" and param(spec, "beta") < 0 or spec.op == "huber" and param(spec, "delta") <= 0:
            raise ValueError("smooth_l1 needs beta >= 0 and huber delta > 0, as PyTorch does")
        if spec.op == "triplet_margin" and param(spec, "p") <= 0:
            raise ValueError(f"the triplet margin loss needs a norm degree p > 0, got {param(spec, 'p')}")
        if spec.op == "cross_entropy" and red == "mean" and spec.dims["M"] >= 2 ** 24:
            raise ValueError("a cross-entropy mean counts its rows in fp32: at most 2**24 rows")
        for key in ("prologue", "epilogue"):
            pointwise.param_chain(spec.params, key)
        if pointwise.operands(spec.params.get("epilogue", [])):
            raise ValueError("a row loss's epilogue takes no tensor operands")

    def inputs(self, spec: KernelSpec) -> list[TensorArg]:
        full, row = ("M", "N"), ("M",)
        if spec.op == "total":
            return _rows.Rows(spec).inputs()
        if spec.op == "kl_div":   # target probabilities (or their logs); x: log-probabilities or probabilities
            return [TensorArg("x", full, init="positive" if param(spec, "log_input") else "randn"),
                    TensorArg("y", full, init="randn" if param(spec, "log_target") else "positive")]
        if spec.op == "hinge_embedding":
            return [TensorArg("x", full), TensorArg("y", full, init="sign")]
        if spec.op == "cross_entropy":
            return [TensorArg("x", full), TensorArg("target", row, "int64", init="index:N")]
        if spec.op == "triplet_margin":
            return [TensorArg("anchor", full), TensorArg("positive", full), TensorArg("negative", full)]
        if spec.op == "cosine_embedding":
            return [TensorArg("x1", full), TensorArg("x2", full), TensorArg("y", row, init="sign")]
        if spec.op == "cosine_similarity":
            return [TensorArg("x1", full), TensorArg("x2", full)]
        return [TensorArg("x", full), TensorArg("y", full)]

    def output(self, spec: KernelSpec) -> TensorArg:
        if reduction(spec) != "none":
            return TensorArg("out", ())
        return TensorArg("out", ("M",) if is_rowwise(spec) else ("M", "N"))

    def reference_source(self, spec: KernelSpec) -> str:
        return _reference(self, spec)

    # -- how --
    def config_space(self, spec: KernelSpec) -> dict[str, list]:
        if is_rowwise(spec):
            top = min(max(_rows.next_pow2(spec.dims["N"]), _rows.MIN_BLOCK_N), 8192)
            return {"BLOCK_N": [b for b in _rows.block_sizes(spec.dims["N"]) if b <= top],
                    "ROWS_PER_PROG": [1, 2, 4, 8, 16], "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3, 4]}
        return {"BLOCK": list(BLOCKS), "WAVES": list(WAVES), "num_warps": [2, 4, 8, 16], "num_stages": [1, 2, 3, 4]}

    def default_config(self, spec: KernelSpec, hw) -> dict:
        M, N = spec.dims["M"], spec.dims["N"]
        if not is_rowwise(spec):   # a few programs per SM striding over 4K-element chunks
            return {"BLOCK": 4096, "WAVES": 4, "num_warps": 8, "num_stages": 2}
        sms = getattr(hw, "sms", None) or 132
        block = min(max(_rows.MIN_BLOCK_N, _rows.next_pow2(N)), 4096 if spec.op == "cross_entropy" else 2048)
        rows = 1
        for r in (2, 4, 8, 16):   # short rows: several per program while the grid still fills the GPU
            if r * block <= 2048 and -(-M // r) >= 4 * sms:
                rows = r
        tile = rows * block
        return {"BLOCK_N": block, "ROWS_PER_PROG": rows, "num_warps": 8 if tile >= 2048 else 4, "num_stages": 2}

    def render(self, spec: KernelSpec, config: dict) -> str:
        space = self.config_space(spec)
        for knob, legal in space.items():
            if config.get(knob) not in legal:
                raise ValueError(f"{knob}={config.get(knob)!r} is not legal here; legal: {legal}")
        return render(spec, {k: config[k] for k in space}, [a.name for a in self.inputs(spec)], self.describe(spec))

    # -- cost and checking --
    def work(self, spec: KernelSpec) -> tuple[float, float]:
        d = spec.dims
        args = [*self.inputs(spec), self.output(spec)]
        nbytes = sum(math.prod(a.concrete_shape(d)) * DTYPE_BYTES[a.dtype or spec.dtype] for a in args)
        per = 3 + len(spec.params.get("prologue", []))
        return float(d["M"] * d["N"] * per), float(nbytes)

    def check_dims(self, spec: KernelSpec, config: dict) -> dict[str, int]:
        """Rows: two row groups and a partial one, >= 2 column chunks plus the real tail.  Flat:
        more chunks than the off-GPU grid has programs, so the grid-stride loop turns."""
        M, N = spec.dims["M"], spec.dims["N"]
        if is_rowwise(spec):
            rows = config["ROWS_PER_PROG"]
            return {"M": min(M, 2 * rows + max(1, rows // 2)), "N": small_dim(N, config["BLOCK_N"])}
        want = (CPU_SMS * config["WAVES"] + 1) * config["BLOCK"] + 37   # elements, with a ragged tail
        n = min(N, max(1, want // 2))
        return {"M": min(M, max(1, -(-want // n))), "N": n}


# fp32 rounding of a difference of inputs, as a fraction of their magnitudes, in units of fp32's
# tolerance (2**-24 / 1e-4, with a margin): losses of x - y are judged against |x| + |y| too
SLACK = 1e-2
_REDUCE = {"mean": "{m}.mean()", "sum": "{m}.sum()", "batchmean": "{m}.sum() / {x}.shape[0]", "none": "{m}"}


def _per_item(spec: KernelSpec, args: list[str]) -> tuple[list[str], str]:
    """(lines, expression): the per-item values in torch, reduced as the spec says when it has no
    epilogue (PyTorch's own reduction, e.g. cross_entropy's mean over the rows not ignored)."""
    red = "none" if spec.params.get("epilogue") else reduction(spec)
    f = "torch.nn.functional."
    if spec.op == "cosine_similarity":   # no reduction= of its own: reduced here
        return [], _REDUCE[red].format(m=f"{f}cosine_similarity(x1, x2, dim=-1, eps={param(spec, 'eps')!r})",
                                       x="x1")
    kwargs = {k: param(spec, k) for k in PARAMS[spec.op] if k not in ("log_input", "epilogue", "prologue")}
    lines = ["x = torch.log(x)"] if spec.op == "kl_div" and param(spec, "log_input") else []
    if spec.op == "triplet_margin":
        kwargs = {"margin": kwargs["margin"], "p": kwargs["p"], "eps": kwargs["eps"], "swap": kwargs["swap"]}
    call = ", ".join([*args, *(f"{k}={v!r}" for k, v in kwargs.items()), f"reduction={red!r}"])
    return lines, f"{f}{TORCH_NAMES[spec.op]}({call})"


def _magnitude(spec: KernelSpec) -> list[str]:
    """Lines leaving `s`, the per-item size the kernel's fp32 rounding error is proportional to."""
    op, f = spec.op, "torch.nn.functional."
    inputs = "x.abs() + y.abs()"
    if op == "mse":
        return ["d = x - y", f"s = d * d + 2 * {SLACK} * d.abs() * ({inputs})"]
    if op in ("l1", "smooth_l1", "huber"):
        gain = max(1.0, float(param(spec, "delta"))) if op == "huber" else 1.0
        return [f"s = (x - y).abs() + {SLACK * gain!r} * ({inputs})"]
    if op == "kl_div":
        if param(spec, "log_target"):
            return [f"s = torch.exp(y) * (y.abs() + x.abs() + {SLACK})"]
        return [f"s = torch.xlogy(y, y).abs() + (y * x).abs() + {SLACK} * y.abs()"]
    if op == "hinge_embedding":
        return [f"s = x.abs() + {abs(float(param(spec, 'margin')))!r}"]
    if op == "cross_entropy":   # logsumexp - the target's logit: rounding follows both terms
        return ["s = torch.logsumexp(x, dim=-1).abs() + x.gather(1, target.clamp(0, x.shape[1] - 1)[:, None])"
                ".squeeze(1).abs()" + (" + x.abs().mean(-1)" if param(spec, "label_smoothing") else "")]
    if op == "triplet_margin":
        p, eps = param(spec, "p"), param(spec, "eps")
        pairs = ["anchor, positive", "anchor, negative"] + (["positive, negative"] if param(spec, "swap") else [])
        dist = " + ".join(f"{f}pairwise_distance({pair}, p={p!r}, eps={eps!r})" for pair in pairs)
        return [f"s = {dist} + {abs(float(param(spec, 'margin')))!r}"]
    margin = abs(float(param(spec, "margin"))) if op == "cosine_embedding" else 0.0
    return [f"s = torch.full(x1.shape[:1], {1.0 + margin!r}, dtype=x1.dtype, device=x1.device)  # |cos| <= 1"]


def _reference(fam: LossFamily, spec: KernelSpec) -> str:
    args = [a.name for a in fam.inputs(spec)]
    first, red = args[0], reduction(spec)
    if spec.op == "total":   # the prologue chain, then its mean or sum; judged against the sum of |values|
        rows = _rows.Rows(spec)
        return (rows.helpers() + rows.ref_function("reference", [f"return x.{red}()"]) + "\n\n"
                + rows.ref_function("error_scale", [f"return x.abs().{red}()"]))
    pre, value = _per_item(spec, args)
    epi = spec.params.get("epilogue", [])
    reduce = _REDUCE[red] if epi else "{m}"
    body = [*pre, f"v = {value}", *step_lines(epi, "v", {}, pointwise.torch_expr), f"return {reduce.format(m='v', x=first)}"]
    scale = [*pre, *_magnitude(spec), f"v = {value}"]
    if epi:   # the error grows through each epilogue step by its local slope (x: the value before it)
        scale.append("x = v")
        for step in epi:
            gain = pointwise.ERROR_GAIN.get(step["op"])
            if gain:
                scale.append("s = " + gain.format(v=step.get("value"), y=None))
            scale += step_lines([step], "x", {}, pointwise.torch_expr)
        scale.append("s = s + x.abs()")
    scale.append(f"return {_REDUCE[red].format(m='s', x=first)}")
    return "\n\n\n".join([signature("reference", args) + "\n" + "\n".join(indent(body)),
                           signature("error_scale", args) + "\n" + "\n".join(indent(scale))]) + "\n"


FAMILY = LossFamily()
