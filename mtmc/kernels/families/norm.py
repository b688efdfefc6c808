"""LayerNorm and RMSNorm over the last dim of x [M, N] -> [M, N].

params: "eps" (default 1e-5 layernorm, 1e-6 rmsnorm), "affine" (default True: layernorm takes
weight and bias [N], rmsnorm weight [N]), "bias" (layernorm only, default True: False keeps the
weight and drops the bias), "prologue" / "epilogue" pointwise chains.
Looped layernorm merges per-chunk mean and squared deviations (Chan et al.'s parallel
Welford), which stays accurate when the mean is large next to the spread, then normalizes in a
second pass; looped rmsnorm accumulates the sum of squares per lane.
"""
from __future__ import annotations

from mtmc.kernels.families import _rows
from mtmc.kernels.family import TensorArg
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import KernelSpec

DEFAULT_EPS = {"layernorm": 1e-5, "rmsnorm": 1e-6}


class NormFamily(_rows.RowFamily):
    name = "norm"
    ops = FAMILY_OPS["norm"]

    def describe(self, spec: KernelSpec) -> str:
        params = f"eps {_eps(spec):g}, " + (" and ".join(n for n, _ in _vectors(spec)) or "no affine")
        return f"{self.layout(spec).describe(spec.op)} ({params})"

    def validate(self, spec: KernelSpec) -> None:
        super().validate(spec)
        _rows.validate_rows(spec, {"prologue", "epilogue", "eps", "affine", "bias"}, epilogue=True)
        _eps(spec)
        for key in ("affine", "bias"):
            if not isinstance(spec.params.get(key, True), bool):
                raise ValueError(f"params '{key}' must be true or false, got {spec.params[key]!r}")
        if spec.op == "rmsnorm" and "bias" in spec.params:
            raise ValueError("rmsnorm has no bias; params 'bias' is for layernorm")

    def layout(self, spec: KernelSpec) -> _rows.Rows:
        return _rows.Rows(spec, _vectors(spec))

    def output(self, spec: KernelSpec) -> TensorArg:
        return TensorArg("out", ("M", "N"))

    def reference_source(self, spec: KernelSpec) -> str:
        eps, names = _eps(spec), [n for n, _ in _vectors(spec)]
        if spec.op == "rmsnorm":
            op = [f"y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + {eps!r})"]
            op += ["y = y * weight"] if names else []
            return self.layout(spec).ref_sources(op, ["s = y.abs()"])
        weight, bias = (names + ["None", "None"])[:2]
        op = [f"y = torch.nn.functional.layer_norm(x, x.shape[-1:], {weight}, {bias}, {eps!r})"]
        # the error follows each term of x_hat * weight + bias, which may cancel
        scale = [f"s = torch.nn.functional.layer_norm(x, x.shape[-1:], None, None, {eps!r}).abs()"]
        scale += [f"s = s * {n}.abs()" if n == "weight" else f"s = s + {n}.abs()" for n in names]
        return self.layout(spec).ref_sources(op, scale)

    def render(self, spec: KernelSpec, config: dict) -> str:
        t = _rows.RowTemplate(self.layout(spec), config, f"{spec.op}_kernel", out_rows_only=False)
        eps, load = _eps(spec), t.load_x()
        stats = _layernorm_stats if spec.op == "layernorm" else _rmsnorm_stats
        if t.single:
            lines, y = stats(eps, single=True)
            body = t.chunks([*load, *lines, *_finish(spec, t, y)])
        else:
            (init, step, after), y = stats(eps, single=False)
            body = [*init, *t.chunks([*load, *step], "pass 1: row statistics"), *after,
                    *t.chunks([*load, *_finish(spec, t, y)], "pass 2: normalize and store")]
        affine = " and ".join(n for n, _ in _vectors(spec)) or "no affine"
        return t.module(f"{spec.op} over the last dim of x [M, N], eps={eps!r}, {affine}", body)

    def work(self, spec: KernelSpec) -> tuple[float, float]:
        # layernorm: sum, subtract, square, sum, scale, weight, bias; rmsnorm drops two of them
        return self.layout(spec).work(7.0 if spec.op == "layernorm" else 5.0, self.output(spec))



def _eps(spec: KernelSpec) -> float:
    return _rows.number_param(spec, "eps", DEFAULT_EPS[spec.op], positive=True)


def _vectors(spec: KernelSpec) -> tuple[tuple[str, str], ...]:
    if not spec.params.get("affine", True):
        return ()
    if spec.op == "layernorm" and spec.params.get("bias", True):
        return (("weight", "positive"), ("bias", "randn"))
    return (("weight", "positive"),)


def _layernorm_stats(eps: float, single: bool):
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


def _rmsnorm_stats(eps: float, single: bool):
    if single:
        return [f"rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + {eps!r})"], "x * rstd[:, None]"
    init = ["sumsq = tl.zeros([ROWS_PER_PROG, BLOCK_N], dtype=tl.float32)"]
    after = [f"rstd = 1.0 / tl.sqrt(tl.sum(sumsq, axis=1) / N + {eps!r})"]
    return (init, ["sumsq += x * x"], after), "x * rstd[:, None]"


def _finish(spec: KernelSpec, t: _rows.RowTemplate, normalized: str) -> list[str]:
    """Apply weight/bias and the epilogue to the normalized tile, and store it."""
    vectors = [n for n, _ in _vectors(spec)]
    lines = [f"y = {normalized}", *(t.load_vector(n) for n in vectors)]
    if vectors:
        lines.append("y = y * weight" + (" + bias" if "bias" in vectors else ""))
    return [*lines, *t.epilogue("y"), t.store("y")]


FAMILY = NormFamily()
