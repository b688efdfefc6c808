"""Normalizations: layer, RMS, L1 and L2 norms over rows, Frobenius normalization, and batch, group
and instance norms over the channels of [N, C, *spatial] tensors.

Row ops, x [M, N] -> [M, N] over the last dim N (a norm over several trailing dims flattens them
into N; its weight is then the flattened [N] vector):
  "layernorm" (eps 1e-5, weight and bias), "rmsnorm" (eps 1e-6, weight), "l2norm" and "l1norm"
  (x / max(||x||, eps), eps default 0: x / x.norm(p=2, dim=-1, keepdim=True); F.normalize's is
  1e-12).  params: "eps", "affine" (layernorm / rmsnorm, default True), "bias" (layernorm only,
  default True), "prologue" / "epilogue" pointwise chains.
"frobenius": x [M, N] / ||x||_F, one statistic over the whole tensor.
Channel ops, x [N, C, S] (S: the spatial sizes' product, 1 for a [N, C] input) -> the same shape:
  "batchnorm": per channel over N and S.  params "training" (default True: batch statistics;
  False: the running_mean / running_var inputs), "momentum" (0.1; None: cumulative average),
  "track_running_stats" (default True), "affine" (weight and bias [C], default True).  In
  training mode the running buffers are launch() keywords the kernel updates as PyTorch does
  (ModelNew passes the module's own buffers); they are not inputs of the spec.
  "groupnorm": per (n, group of C / "groups" channels) over those channels and S; "affine".
  "instancenorm": per (n, c) over S; "affine" (default False, as nn.InstanceNorm*d).
  All take "eps" (1e-5) and an "epilogue" chain (full [N, C, S], broadcast or one-value operands).

Kernels: a row op whose rows fit the GPU's programs runs the row-wise template (_rows: the row
in registers, or Welford chunks along it).  Channel ops, Frobenius, and row ops with SPLIT > 1
(few long rows) run the split template (_norm_split): partial statistics from SPLIT programs per
statistic, merged, then one normalize pass.
"""
from __future__ import annotations

import math

from mtmc.kernels import pointwise
from mtmc.kernels.families import _norm_split as split
from mtmc.kernels.families import _rows
from mtmc.kernels.family import DTYPE_BYTES, TensorArg, small_dim
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import DTYPES, KernelSpec

DEFAULT_EPS = {"layernorm": 1e-5, "rmsnorm": 1e-6, "l2norm": 0.0, "l1norm": 0.0, "frobenius": 0.0,
               "batchnorm": 1e-5, "groupnorm": 1e-5, "instancenorm": 1e-5}
ROW_OPS = ("layernorm", "l2norm", "l1norm", "rmsnorm")
INNER_OPS = ("l2norm", "l1norm", "rmsnorm")   # also over a middle dim (the channels of [N, C, *spatial])
CHANNEL_OPS = ("batchnorm", "groupnorm", "instancenorm")
SPLITS = [1 << k for k in range(11)]          # 1 .. 1024 programs per statistic
TILES = [1 << k for k in range(8, 15)]        # 256 .. 16384 elements per normalize tile
SPLIT_TILE = 4096                             # elements per tile of the split template's default
CHANNEL_PARAMS = {
    "batchnorm": {"eps", "affine", "training", "momentum", "track_running_stats", "prologue", "epilogue"},
    "groupnorm": {"eps", "affine", "groups", "prologue", "epilogue"},
    "instancenorm": {"eps", "affine", "prologue", "epilogue"},
}
# (stat kind, the scale from {count} elements' {m2} (sum of squared deviations) or {sum})
_RSTD = "1.0 / tl.sqrt({m2} / {count} + {eps})"
STATS = {
    "layernorm": ("meanvar", _RSTD), "batchnorm": ("meanvar", _RSTD), "groupnorm": ("meanvar", _RSTD),
    "instancenorm": ("meanvar", _RSTD),
    "rmsnorm": ("sumsq", "1.0 / tl.sqrt({sum} / {count} + {eps})"),
    "l2norm": ("sumsq", "1.0 / tl.maximum(tl.sqrt({sum}), {eps})"),
    "frobenius": ("sumsq", "1.0 / tl.maximum(tl.sqrt({sum}), {eps})"),
    "l1norm": ("sumabs", "1.0 / tl.maximum({sum}, {eps})"),
}


class ChannelRows(_rows.Rows):
    """The tensors of a channel op: x [N, C, S], per-channel vectors [C], epilogue operands."""

    def inputs(self) -> list[TensorArg]:
        def arg(op: _rows.Operand) -> TensorArg:
            return TensorArg(op.name, pointwise.operand_shape(op.chain_step, full=("N", "C", "S")))
        return ([TensorArg("x", ("N", "C", "S"))] + [TensorArg(n, ("C",), init=init) for n, init in self.vectors]
                + [arg(o) for o in self.epi_operands])

    def work(self, per_element: float, out: TensorArg) -> tuple[float, float]:
        d = self.spec.dims
        flops = float(d["N"] * d["C"] * d["S"]) * (per_element + len(self.epilogue))
        nbytes = sum(math.prod(a.concrete_shape(d)) * DTYPE_BYTES[a.dtype or self.spec.dtype]
                     for a in [*self.inputs(), out])
        return flops, float(nbytes)

    def describe(self, what: str) -> str:
        d = self.spec.dims
        text = f"{what} of a {d['N']}x{d['C']}x{d['S']} (batch x channels x spatial) {self.spec.dtype} tensor"
        if self.prologue:
            text += f", applied to x after {pointwise.describe_chain(self.prologue)}"
        if self.epilogue:
            text += f", then {pointwise.describe_chain(self.epilogue)} on the result"
        return text


class NormFamily(_rows.RowFamily):
    name = "norm"
    ops = FAMILY_OPS["norm"]

    # -- what ------------------------------------------------------------------------------
    def describe(self, spec: KernelSpec) -> str:
        words = [f"eps {_eps(spec):g}"]
        if spec.op == "groupnorm":
            words.append(f"{spec.params.get('groups')} groups")
        if spec.op == "batchnorm":
            words.append("batch statistics" if _training(spec) else "running statistics")
        if spec.op not in ("l1norm", "l2norm", "frobenius"):
            words.append(" and ".join(n for n, _ in _vectors(spec) if n in ("weight", "bias")) or "no affine")
        what = {"frobenius": "Frobenius normalization", "l1norm": "L1 normalization",
                "l2norm": "L2 normalization"}.get(spec.op, spec.op)
        if spec.op == "frobenius":   # one norm over the whole tensor, not per row
            text = f"{what} of a {spec.dims['M']}x{spec.dims['N']} {spec.dtype} tensor (one norm of all elements)"
            epi = spec.params.get("epilogue")
            return text + (f", then {pointwise.describe_chain(epi)} on the result" if epi else "")
        return f"{self.layout(spec).describe(what)} ({', '.join(words)})"

    def validate(self, spec: KernelSpec) -> None:
        super().validate(spec)
        if spec.op in CHANNEL_OPS:
            _validate_channels(spec)
        else:
            allowed = {"prologue", "epilogue", "eps"} | ({"affine", "bias"} if spec.op in ("layernorm", "rmsnorm") else set())
            allowed |= {"inner"} if spec.op in INNER_OPS else set()   # over the middle dim of [M / Q, N, Q]
            _rows.validate_rows(spec, allowed, epilogue=True)
        _eps(spec)
        for key in ("affine", "bias", "training", "track_running_stats"):
            if not isinstance(spec.params.get(key, True), bool):
                raise ValueError(f"params '{key}' must be true or false, got {spec.params[key]!r}")
        if spec.op == "rmsnorm" and "bias" in spec.params:
            raise ValueError("rmsnorm has no bias; params 'bias' is for layernorm")
        if spec.op == "frobenius" and spec.params.get("prologue"):
            raise ValueError("frobenius normalization takes no prologue")

    def layout(self, spec: KernelSpec) -> _rows.Rows:
        if spec.op in CHANNEL_OPS:
            return ChannelRows(spec, _vectors(spec))
        return _rows.Rows(spec, _vectors(spec))

    def output(self, spec: KernelSpec) -> TensorArg:
        return TensorArg("out", ("N", "C", "S") if spec.op in CHANNEL_OPS else ("M", "N"))

    def reference_source(self, spec: KernelSpec) -> str:
        eps, names = _eps(spec), [n for n, _ in _vectors(spec)]
        lay = self.layout(spec)
        if spec.op in ("rmsnorm", "l1norm", "l2norm", "frobenius"):
            d = lay.red_dim   # the last dim, or the middle one of a strided [M / Q, N, Q] view
            norm = {"rmsnorm": f"torch.sqrt(x.pow(2).mean(dim={d}, keepdim=True) + {eps!r})",
                    "l2norm": f"x.norm(p=2, dim={d}, keepdim=True).clamp_min({eps!r})",
                    "l1norm": f"x.abs().sum(dim={d}, keepdim=True).clamp_min({eps!r})",
                    "frobenius": f"torch.norm(x, p='fro').clamp_min({eps!r})"}[spec.op]
            op = [f"y = x / {norm}"] + (["y = y * weight"] if "weight" in names else [])
            out_view = f".reshape(-1, {spec.dims['N']})" if lay.inner > 1 else ""
            return lay.ref_sources(op, ["s = y.abs()"], out_view)
        weight, bias = [n if n in names else "None" for n in ("weight", "bias")]
        op = [f"y = {_torch_norm(spec, weight, bias)}"]
        # the error follows each term of x_hat * weight + bias, which may cancel; [C] vectors
        # broadcast over the channel dim of [N, C, S]
        view = ".reshape(-1, 1)" if spec.op in CHANNEL_OPS else ""
        scale = [f"s = ({_torch_norm(spec, 'None', 'None')}).abs()"]
        scale += [f"s = s * weight.abs(){view}"] if weight != "None" else []
        scale += [f"s = s + bias.abs(){view}"] if bias != "None" else []
        return lay.ref_sources(op, scale)

    # -- how -------------------------------------------------------------------------------
    def config_space(self, spec: KernelSpec) -> dict[str, list]:
        if spec.op in ROW_OPS:
            space = _rows.config_space(spec)
            splittable = not pointwise.operands(spec.params.get("prologue", [])) and spec.params.get("inner", 1) == 1
            return {**space, "SPLIT": list(SPLITS) if splittable else [1]}
        (P, T, Q), _ = _views(spec)
        blocks = lambda n, cap: [1 << k for k in range(min(_rows.next_pow2(n), cap).bit_length())]  # noqa: E731
        return {"BLOCK_P": blocks(P, 256), "BLOCK_T": blocks(T, 256), "BLOCK_Q": blocks(Q, 8192),
                "SPLIT": list(SPLITS), "num_warps": list(_rows.WARPS), "NORM_BLOCK": list(TILES),
                "norm_warps": list(_rows.WARPS)}

    def default_config(self, spec: KernelSpec, hw) -> dict:
        sms = getattr(hw, "sms", None) or 132
        if spec.op in ROW_OPS and spec.params.get("inner", 1) > 1:
            # over a middle dim: neighbouring positions q as rows (coalesced), the whole of N in one
            # tile when it fits, so x is read once
            n, q = spec.dims["N"], spec.params["inner"]
            block = max(_rows.MIN_BLOCK_N, min(_rows.next_pow2(n), SPLIT_TILE))
            rows = max(_rows.INNER_ROWS_PER_PROG[0], min(_rows.INNER_ROWS_PER_PROG[-1], SPLIT_TILE // block,
                                                         _rows.next_pow2(q)))
            return {"BLOCK_N": block, "num_warps": _rows.warps_for(rows * block), "num_stages": 1 if block >= n else 2,
                    "ROWS_PER_PROG": rows, "PERSISTENT": False, "SPLIT": 1}
        if spec.op in ROW_OPS:
            cfg = {**_rows.default_config(spec, hw), "SPLIT": 1}
            M, N = spec.dims["M"], spec.dims["N"]
            if cfg["BLOCK_N"] < N and M < 4 * sms and len(self.config_space(spec)["SPLIT"]) > 1:
                # few long rows: split each across programs so the grid fills the GPU
                cfg["SPLIT"] = _split_for(-(-M // cfg["ROWS_PER_PROG"]), -(-N // cfg["BLOCK_N"]), sms)
            return cfg
        view, _ = _views(spec)
        bp, bt, bq = split.tile(view, SPLIT_TILE)
        items = -(-view[0] // bp) * -(-view[2] // bq)
        return {"BLOCK_P": bp, "BLOCK_T": bt, "BLOCK_Q": bq, "SPLIT": _split_for(-(-view[1] // bt), items, sms),
                "num_warps": _rows.warps_for(bp * bt * bq), "NORM_BLOCK": SPLIT_TILE,
                "norm_warps": _rows.warps_for(SPLIT_TILE)}

    def render(self, spec: KernelSpec, config: dict) -> str:
        if spec.op in CHANNEL_OPS or spec.op == "frobenius" or config.get("SPLIT", 1) > 1:
            return self._render_split(spec, config)
        t = _rows.RowTemplate(self.layout(spec), config, f"{spec.op}_kernel", out_rows_only=False)
        eps, load = _eps(spec), t.load_x()
        stats = _layernorm_stats if spec.op == "layernorm" else _sum_stats
        if t.single:
            lines, y = stats(spec, eps, single=True)
            body = t.chunks([*load, *lines, *_finish(spec, t, y)])
        else:
            (init, step, after), y = stats(spec, eps, single=False)
            body = [*init, *t.chunks([*load, *step], "pass 1: row statistics"), *after,
                    *t.chunks([*load, *_finish(spec, t, y)], "pass 2: normalize and store")]
        affine = " and ".join(n for n, _ in _vectors(spec)) or "no affine"
        return t.module(f"{spec.op} over the last dim of x [M, N], eps={eps!r}, {affine}", body)

    def _render_split(self, spec: KernelSpec, config: dict) -> str:
        space = self.config_space(spec)
        for knob, legal in space.items():
            if config.get(knob) not in legal:
                raise ValueError(f"{knob}={config.get(knob)!r} is not legal for this {spec.op}; legal: {legal}")
        if spec.op in ROW_OPS:  # the row knobs as the split template's tiles
            cfg = {"BLOCK_P": 1, "BLOCK_T": config["ROWS_PER_PROG"], "BLOCK_Q": config["BLOCK_N"],
                   "SPLIT": config["SPLIT"], "num_warps": config["num_warps"],
                   "NORM_BLOCK": config["ROWS_PER_PROG"] * config["BLOCK_N"], "norm_warps": config["num_warps"]}
        else:
            cfg = dict(config)
        lay = _layout(self, spec)
        _, apply_view = _views(spec)
        apply_tile = split.tile(apply_view, cfg["NORM_BLOCK"])
        header = (f"# MTMC kernel: {self.describe(spec)}\n# config: "
                  + " ".join(f"{k}={cfg[k]}" for k in sorted(cfg)) + "\n")
        return split.render(lay, cfg, apply_tile, header)

    # -- cost and checking -----------------------------------------------------------------
    def stream_shape(self, spec: KernelSpec, config: dict) -> tuple[int, int, int] | None:
        """For the roofline model: the split template's statistics pass (the one its knobs
        shape) as (programs, elements per iteration, iterations); None for the row template."""
        if spec.op in ROW_OPS and config.get("SPLIT", 1) == 1:
            return None
        if spec.op in ROW_OPS:
            config = {"BLOCK_P": 1, "BLOCK_T": config["ROWS_PER_PROG"], "BLOCK_Q": config["BLOCK_N"],
                      "SPLIT": config["SPLIT"]}
        (P, T, Q), _ = _views(spec)
        bp, bt, bq = config["BLOCK_P"], config["BLOCK_T"], config["BLOCK_Q"]
        items = -(-P // bp) * -(-Q // bq)
        return -(-T // bt) * config["SPLIT"], bp * bt * min(bq, Q), -(-items // config["SPLIT"])

    def work(self, spec: KernelSpec) -> tuple[float, float]:
        # mean/variance norms: sum, subtract, square, sum, scale, weight, bias; sum-only ones fewer
        per = 7.0 if STATS[spec.op][0] == "meanvar" else 5.0
        return self.layout(spec).work(per, self.output(spec))

    def check_dims(self, spec: KernelSpec, config: dict) -> dict[str, int]:
        d = spec.dims
        if spec.op in ROW_OPS:
            return _rows.check_dims(spec, config)
        if spec.op == "frobenius":
            return {"M": min(d["M"], 3), "N": small_dim(d["N"], min(config["BLOCK_Q"], 1024))}
        if spec.op == "batchnorm":
            n = small_dim(d["N"], config["BLOCK_P"])
            return {"N": max(2, min(n, 33)) if d["N"] >= 2 else 1, "C": small_dim(d["C"], config["BLOCK_T"]),
                    "S": small_dim(d["S"], config["BLOCK_Q"])}
        if spec.op == "groupnorm":
            g = int(spec.params["groups"])
            cg = min(d["C"] // g, 2)
            return {"N": min(d["N"], 2), "C": g * cg, "S": small_dim(d["S"], max(1, config["BLOCK_Q"] // cg))}
        return {"N": min(d["N"], 2), "C": min(d["C"], 3), "S": small_dim(d["S"], config["BLOCK_Q"])}


# -- spec pieces ------------------------------------------------------------------------------

def _eps(spec: KernelSpec) -> float:
    eps = _rows.number_param(spec, "eps", DEFAULT_EPS[spec.op], positive=DEFAULT_EPS[spec.op] > 0)
    if eps < 0:   # the normalizations' eps clamps the norm from below (0: none)
        raise ValueError(f"params 'eps' must be >= 0, got {eps!r}")
    return eps


def _training(spec: KernelSpec) -> bool:
    """Batch statistics: batchnorm in training mode, or without running buffers."""
    p = spec.params
    return bool(p.get("training", True)) or not p.get("track_running_stats", True)


def _vectors(spec: KernelSpec) -> tuple[tuple[str, str], ...]:
    if spec.op in ("l1norm", "l2norm", "frobenius"):
        return ()
    running = (("running_mean", "randn"), ("running_var", "positive")) if (
        spec.op == "batchnorm" and not _training(spec)) else ()
    if not spec.params.get("affine", spec.op != "instancenorm"):
        return running
    if spec.op != "rmsnorm" and spec.params.get("bias", True):
        return (("weight", "positive"), ("bias", "randn"), *running)
    return (("weight", "positive"), *running)


def _validate_channels(spec: KernelSpec) -> None:
    p, d = spec.params, spec.dims
    if set(d) != {"N", "C", "S"}:
        raise ValueError(f"{spec.op} takes dims N (batch), C (channels) and S (the spatial sizes' product); "
                         f"got {sorted(d)}")
    for name, size in d.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"dim {name} must be a positive integer, got {size!r}")
    if spec.dtype not in DTYPES:
        raise ValueError(f"dtype {spec.dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    unknown = set(p) - CHANNEL_PARAMS[spec.op]
    if unknown:
        raise ValueError(f"{spec.op} does not understand params {sorted(unknown)}; it takes "
                         f"{sorted(CHANNEL_PARAMS[spec.op])}")
    if spec.op == "groupnorm":
        g = p.get("groups")
        if isinstance(g, bool) or not isinstance(g, int) or g < 1 or d["C"] % g:
            raise ValueError(f"groupnorm needs params 'groups', a positive int dividing C={d['C']}; got {g!r}")
    if spec.op == "batchnorm":
        m = p.get("momentum", 0.1)
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m <= 1):
            raise ValueError(f"params 'momentum' must be a number in [0, 1] or None, got {m!r}")
        if _training(spec) and d["N"] * d["S"] < 2:
            raise ValueError("batch norm with batch statistics needs more than one value per channel "
                             f"(N x S = {d['N'] * d['S']}), as PyTorch does")
    pointwise.param_chain(p, "prologue", operand_free=spec.op)   # the split template applies it to x alone
    epi = pointwise.param_chain(p, "epilogue")
    if any(pointwise.operand_kind(s) == "vector" for s in epi):
        raise ValueError(f"{spec.op} epilogues take full, broadcast (periodic) or one-value operands, "
                         "not [N] vectors")


def _torch_norm(spec: KernelSpec, weight: str, bias: str) -> str:
    F, eps = "torch.nn.functional", _eps(spec)
    if spec.op == "layernorm":
        return f"{F}.layer_norm(x, x.shape[-1:], {weight}, {bias}, {eps!r})"
    if spec.op == "groupnorm":
        return f"{F}.group_norm(x, {spec.params['groups']}, {weight}, {bias}, {eps!r})"
    if spec.op == "instancenorm":
        return f"{F}.instance_norm(x, weight={weight}, bias={bias}, eps={eps!r})"
    if _training(spec):   # batch statistics; the running-buffer update is no part of the output
        return f"{F}.batch_norm(x, None, None, {weight}, {bias}, True, 0.0, {eps!r})"
    return f"{F}.batch_norm(x, running_mean, running_var, {weight}, {bias}, False, 0.0, {eps!r})"


def _views(spec: KernelSpec) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The spec's (statistics view, normalize view) as [P, T, Q] sizes (see _norm_split)."""
    d = spec.dims
    if spec.op == "frobenius":
        return (1, 1, d["M"] * d["N"]), (1, 1, d["M"] * d["N"])
    if spec.op in ROW_OPS:
        return (1, d["M"], d["N"]), (1, d["M"], d["N"])
    full = (d["N"], d["C"], d["S"])
    if spec.op == "batchnorm":
        return full, full
    g = d["C"] if spec.op == "instancenorm" else int(spec.params["groups"])
    return (1, d["N"] * g, d["C"] // g * d["S"]), full


def _layout(fam: NormFamily, spec: KernelSpec) -> split.Layout:
    rows = fam.layout(spec)
    stat, scale = STATS[spec.op]
    names = rows.names()
    vectors = tuple(n for n, _ in _vectors(spec) if n in ("weight", "bias"))
    if spec.op in ROW_OPS or spec.op == "frobenius":
        sizes = "M, N = x.shape"
        stats_view = ("1", "1", "M * N") if spec.op == "frobenius" else ("1", "M", "N")
        apply_view, stat_of, weight_by = stats_view, ("0", "1"), "q"
    else:
        sizes = "NB, C, S = x.shape"
        apply_view, weight_by = ("NB", "C", "S"), "t"
        if spec.op == "batchnorm":
            stats_view, stat_of = ("NB", "C", "S"), ("0", "1")
        elif spec.op == "instancenorm":
            stats_view, stat_of = ("1", "NB * C", "S"), ("C", "1")
        else:
            g = int(spec.params["groups"])
            sizes += f"\nG = {g}  # groups"
            stats_view, stat_of = ("1", "NB * G", "C // G * S"), ("G", "C // G")
    running = ""
    if spec.op == "batchnorm":
        running = "update" if spec.params.get("training", True) and spec.params.get("track_running_stats", True) \
            else ("read" if not _training(spec) else "")
    return split.Layout(stat=stat, sizes=sizes, stats_view=stats_view, apply_view=apply_view, stat_of=stat_of,
                        scale=scale.format(m2="m2", sum="mean", count="tl.maximum(count, 1.0)", eps="eps"),
                        weight_by=weight_by, vectors=vectors, inputs=tuple(names),
                        epilogue=tuple(rows.epilogue), epi_names=rows.step_names(rows.epi_operands),
                        running=running, prologue=tuple(rows.prologue), eps=_eps(spec),
                        momentum=spec.params.get("momentum", 0.1))


def _split_for(groups: int, items: int, sms: int) -> int:
    """Programs per statistic: enough for ~8 programs per SM, each with >= 4 tiles to walk."""
    s = 1
    while s < SPLITS[-1] and groups * s < 8 * sms and items // (2 * s) >= 4:
        s *= 2
    return s


# -- the row template's statistics -----------------------------------------------------------

def _layernorm_stats(spec: KernelSpec, eps: float, single: bool):
    """Single pass: (lines leaving rstd, the normalized tile).  Looped: ((init, per-chunk,
    after) lines, the normalized tile); each chunk's (count, mean, M2) merges into the row's."""
    if single:
        return ["mean = tl.sum(x, axis=1) / N",
                "xc = tl.where(col_mask[None, :], x - mean[:, None], 0.0)",
                f"rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + {eps!r})"], "xc * rstd[:, None]"
    init = ["mean = tl.zeros([ROWS_PER_PROG], dtype=tl.float32)",
            "m2 = tl.zeros([ROWS_PER_PROG], dtype=tl.float32)"]
    merge = ["count = tl.minimum(N - start, BLOCK_N).to(tl.float32)  # valid columns in this chunk",
             "chunk_mean = tl.sum(x, axis=1) / count",
             "xc = tl.where(col_mask[None, :], x - chunk_mean[:, None], 0.0)",
             "delta = chunk_mean - mean",
             "seen = start + count",
             "mean += delta * (count / seen)",
             "m2 += tl.sum(xc * xc, axis=1) + delta * delta * ((seen - count) * count / seen)"]
    after = [f"rstd = 1.0 / tl.sqrt(m2 / N + {eps!r})"]
    return (init, merge, after), "(x - mean[:, None]) * rstd[:, None]"


def _sum_stats(spec: KernelSpec, eps: float, single: bool):
    """rmsnorm, l2norm, l1norm: one sum per row (of x^2 or |x|), then a scale."""
    term = "tl.abs(x)" if spec.op == "l1norm" else "x * x"
    scale = STATS[spec.op][1].format(sum="total", count="N", eps=repr(eps), m2="")
    if single:
        return [f"total = tl.sum({term}, axis=1)", f"rstd = {scale}"], "x * rstd[:, None]"
    init = ["acc = tl.zeros([ROWS_PER_PROG, BLOCK_N], dtype=tl.float32)"]
    return (init, [f"acc += {term}"], ["total = tl.sum(acc, axis=1)", f"rstd = {scale}"]), "x * rstd[:, None]"


def _finish(spec: KernelSpec, t: _rows.RowTemplate, normalized: str) -> list[str]:
    """Apply weight/bias and the epilogue to the normalized tile, and store it."""
    vectors = [n for n, _ in _vectors(spec)]
    lines = [f"y = {normalized}", *(t.load_vector(n) for n in vectors)]
    if vectors:
        lines.append("y = y * weight" + (" + bias" if "bias" in vectors else ""))
    return [*lines, *t.epilogue("y"), t.store("y")]


FAMILY = NormFamily()
