"""Row reductions: sum, mean, max, min, argmax, argmin, prod, logsumexp, var over the last dim of
x [M, N] -> [M], or over the middle dim of x's buffer seen as [M / inner, N, inner] (params
"inner", see _rows; several neighbouring dims of a tensor are one N), with a pointwise prologue
on x and an epilogue of operand-free steps on the result (x.sum(-1) * s, logsumexp then relu).

Looped kernels keep a [ROWS_PER_PROG, BLOCK_N] accumulator (one running value per lane) and
reduce it across lanes once at the end, so each chunk costs only elementwise work.  logsumexp is
stable: the row's max comes out before the exponentials (single pass), or each lane keeps a
running max and rescales its running sum when the max grows (looped, one read of x).  var
(params "correction", torch's; std is var then sqrt) subtracts the row's mean before squaring
(single pass), or keeps Welford's count, mean and M2 per lane and merges the lanes at the end
(looped, one read of x): never the sum of squares minus the squared sum, which cancels.
"""
from __future__ import annotations

from mtmc.kernels import pointwise
from mtmc.kernels.families import _rows, _split
from mtmc.kernels.family import TensorArg
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import KernelSpec

INDEX_OPS = {"argmax": "max", "argmin": "min"}
# Padding value that can never win or count, per op.
FILL = {"sum": "0.0", "mean": "0.0", "max": 'float("-inf")', "min": 'float("inf")',
        "argmax": 'float("-inf")', "argmin": 'float("inf")', "prod": "1.0", "logsumexp": 'float("-inf")', "var": "0.0"}
TORCH = {"sum": "torch.sum", "mean": "torch.mean", "max": "torch.amax", "min": "torch.amin",
         "argmax": "torch.argmax", "argmin": "torch.argmin", "prod": "torch.prod", "logsumexp": "torch.logsumexp",
         "var": "torch.var"}
# A product's tiny values underflow in the output dtype: its smallest normal, over the dtype's
# tolerance, is the least error scale (so a flushed 1e-40 is not a wrong value).
PROD_FLOOR = {"float32": 1.2e-34, "float16": 0.0123, "bfloat16": 4e-37}
# tl has no product reduction: the combine function for tl.reduce.
MUL_SOURCE = '''
@triton.jit
def _mul(a, b):
    return a * b
'''

# Judges argmax/argmin: any index whose value equals the row's extreme (within tol times the
# row's largest |value|, for prologue arithmetic done in fp32) is right; ties are common in fp16.
_INDEX_JUDGE = '''
def _judge_index(out, x, largest, tol):
    M, N = x.shape
    if tuple(out.shape) != (M,) or out.dtype != torch.int64:
        return False, f"output is {out.dtype} {tuple(out.shape)}, expected int64 ({M},)", math.inf, math.inf
    bad = (out < 0) | (out >= N)
    if bad.any():
        return False, f"{int(bad.sum())} of {M} indices outside [0, {N})", math.inf, math.inf
    picked = x.gather(1, out[:, None]).squeeze(1)
    best = x.amax(dim=-1) if largest else x.amin(dim=-1)
    gap = (best - picked).abs()
    allowed = tol * x.abs().amax(dim=-1)
    wrong = int((gap > allowed).sum())
    unit = 1e-5 * x.abs().amax(dim=-1) + 1e-30
    max_abs, max_rel = float(gap.max()), float((gap / unit).max())
    if wrong:
        return False, f"{wrong} of {M} rows point at a non-extreme value (max gap {max_abs:.3g})", max_abs, max_rel
    return True, "every index points at its row's extreme value", max_abs, max_rel
'''


class ReductionFamily(_rows.RowFamily):
    name = "reduction"
    ops = FAMILY_OPS["reduction"]

    def describe(self, spec: KernelSpec) -> str:
        text = self.layout(spec).describe(spec.op)
        return text + (" (int64 indices)" if spec.op in INDEX_OPS else "")

    def validate(self, spec: KernelSpec) -> None:
        super().validate(spec)
        _rows.validate_rows(spec, {"prologue", "inner", "epilogue", "correction"}, epilogue=True)
        if "correction" in spec.params and (spec.op != "var" or not isinstance(spec.params["correction"], int)
                                            or spec.params["correction"] < 0):
            raise ValueError("correction is a var's, a non-negative integer")
        epi = spec.params.get("epilogue", [])
        if any(pointwise.operand_kind(step) for step in epi):
            raise ValueError("a reduction's epilogue takes steps without another tensor (scale, relu ...)")
        if epi and spec.op in INDEX_OPS:
            raise ValueError(f"{spec.op} returns indices: no epilogue after it")

    def output(self, spec: KernelSpec) -> TensorArg:
        return TensorArg("out", ("M",), "int64" if spec.op in INDEX_OPS else None)

    def reference_source(self, spec: KernelSpec) -> str:
        rows = self.layout(spec)
        flat = ".reshape(-1)" if rows.inner > 1 else ""  # [P, Q] results in the kernel's row order
        extra = f", correction={_correction(spec)}" if spec.op == "var" else ""
        y = [f"y = {TORCH[spec.op]}(x, dim={rows.red_dim}{extra}){flat}"]
        if spec.op == "var":   # rounding the deviations: an error relative to the mean square
            scale = [f"s = x.pow(2).mean(dim={rows.red_dim}){flat} + y.abs()"]
        elif spec.op in ("sum", "mean"):
            # accumulation-order error grows with the sum of |x|, not with |sum x|
            reduce = "sum" if spec.op == "sum" else "mean"
            scale = [f"s = x.abs().{reduce}(dim={rows.red_dim}){flat}"]
        elif spec.op == "logsumexp":   # an error relative to the sum of exponentials, plus x's rounding
            scale = [f"s = 1.0 + x.abs().amax(dim={rows.red_dim}){flat}"]
        elif spec.op == "prod":
            scale = [f"s = y.abs() + {PROD_FLOOR[spec.dtype]!r}"]
        else:
            scale = ["s = y.abs()"]
        if spec.op not in INDEX_OPS:
            return rows.ref_sources(y, scale)   # with the helpers, and s carried through the epilogue
        parts = [rows.ref_function("reference", [*y, "return y"])]
        if spec.op in INDEX_OPS:
            tol = 1e-5 if rows.prologue else 0.0   # no prologue: the kernel compares exact values
            largest = INDEX_OPS[spec.op] == "max"
            parts += [_INDEX_JUDGE,
                      rows.ref_function("compare", [f"return _judge_index(out, x, {largest}, {tol})"], ("out",),
                                        logical=True)]
        return rows.helpers() + "\n\n".join(parts)

    # -- the split knob: a few long rows shared by many programs (kernels.families._split) --
    def config_space(self, spec: KernelSpec) -> dict[str, list]:
        return {**_rows.config_space(spec), "SPLIT": list(_split.SPLITS) if _split.splittable(spec) else [1]}

    def default_config(self, spec: KernelSpec, hw) -> dict:
        config = _rows.default_config(spec, hw)
        return {**config, "SPLIT": _split.default_split(spec, config["BLOCK_N"], hw)}

    def check_dims(self, spec: KernelSpec, config: dict) -> dict[str, int]:
        dims = _rows.check_dims(spec, config)
        if config.get("SPLIT", 1) > 1:   # several segments, the last one ragged
            dims["N"] = min(spec.dims["N"], 3 * config["BLOCK_N"] + 17)
        return dims

    def render(self, spec: KernelSpec, config: dict) -> str:
        if config.get("SPLIT", 1) > 1:
            if config["SPLIT"] not in self.config_space(spec)["SPLIT"]:
                raise ValueError(f"SPLIT={config['SPLIT']} is not legal for {spec.op} over {spec.dims['M']} rows")
            return _split.render(self, spec, config, _looped, FILL[spec.op])
        t = _rows.RowTemplate(self.layout(spec), config, f"{spec.op}_rows_kernel", out_rows_only=True)
        load = t.load_x(FILL[spec.op])
        if spec.op == "var":
            body = _variance(t, load, _correction(spec))
        else:
            body = _single_pass(spec.op, t, load) if t.single else _looped(spec.op, t, load)
        title = (f"{spec.op} over the last dim of x [M, N] -> out [M]" if not t.strided
                 else f"{spec.op} over dim 1 of x [M / Q, N, Q] -> out [M]")
        source = t.module(title, body + t.epilogue("value") + [t.store("value")])
        if spec.op == "prod":   # the combine function goes before the kernel that calls it
            source = source.replace("@triton.jit", MUL_SOURCE.strip("\n") + "\n\n\n@triton.jit", 1)
        return source

    def work(self, spec: KernelSpec) -> tuple[float, float]:
        return self.layout(spec).work({"logsumexp": 3.0, "var": 6.0}.get(spec.op, 1.0), self.output(spec))


def _correction(spec: KernelSpec) -> int:
    return int(spec.params.get("correction", 1))


def _variance(t: _rows.RowTemplate, load: list[str], correction: int) -> list[str]:
    """var over the row (x's padding is 0.0): N - correction in the denominator, as torch.var
    (0 / 0 = nan where N <= correction, as torch gives)."""
    denominator = f"(N - {correction})"
    if t.single:
        return t.chunks([*load, "mean = tl.sum(x, axis=1) / N",
                         "d = tl.where(col_mask[None, :], x - mean[:, None], 0.0)",
                         f"value = tl.sum(d * d, axis=1) / {denominator}"])
    tile = "[ROWS_PER_PROG, BLOCK_N]"
    init = [f"count = tl.zeros({tile}, dtype=tl.float32)", f"lane_mean = tl.zeros({tile}, dtype=tl.float32)",
            f"m2 = tl.zeros({tile}, dtype=tl.float32)"]
    step = ["valid = tl.where(col_mask[None, :], 1.0, 0.0)",   # Welford, per lane
            "count += valid",
            "delta = x - lane_mean",
            "lane_mean += valid * delta / tl.maximum(count, 1.0)",
            "m2 += valid * delta * (x - lane_mean)"]
    final = ["mean = tl.sum(count * lane_mean, axis=1) / N",   # the lanes merged (Chan et al.)
             "spread = lane_mean - mean[:, None]",
             f"value = (tl.sum(m2, axis=1) + tl.sum(count * spread * spread, axis=1)) / {denominator}"]
    return [*init, *t.chunks([*load, *step]), *final]



def _single_pass(op: str, t: _rows.RowTemplate, load: list[str]) -> list[str]:
    if op == "logsumexp":
        return t.chunks([*load, "row_max = tl.max(x, axis=1)",
                         "shift = tl.where(row_max == float(\"-inf\"), 0.0, row_max)  # a row of -inf stays -inf",
                         "value = shift + tl.log(tl.sum(tl.exp(x - shift[:, None]), axis=1))"])
    reduce = {"sum": "tl.sum(x, axis=1)", "mean": "tl.sum(x, axis=1) / N", "max": "tl.max(x, axis=1)",
              "min": "tl.min(x, axis=1)", "argmax": "tl.argmax(x, axis=1)", "argmin": "tl.argmin(x, axis=1)",
              "prod": "tl.reduce(x, 1, _mul)"}[op]
    return t.chunks([*load, f"value = {reduce}"])


def _looped(op: str, t: _rows.RowTemplate, load: list[str]) -> list[str]:
    tile = "[ROWS_PER_PROG, BLOCK_N]"
    if op in ("sum", "mean"):
        init = [f"acc = tl.zeros({tile}, dtype=tl.float32)"]
        step = ["acc += x"]
        final = ["value = tl.sum(acc, axis=1)" + (" / N" if op == "mean" else "")]
    elif op == "prod":
        init = [f"acc = tl.full({tile}, 1.0, tl.float32)"]
        step = ["acc *= x"]
        final = ["value = tl.reduce(acc, 1, _mul)"]
    elif op == "logsumexp":   # per lane: running max m and sum of exp(x - m), rescaled as m grows
        init = [f"m = tl.full({tile}, float(\"-inf\"), tl.float32)", f"acc = tl.zeros({tile}, dtype=tl.float32)"]
        step = ["new_m = tl.maximum(m, x)",
                "shift = tl.where(new_m == float(\"-inf\"), 0.0, new_m)  # no -inf - -inf",
                "acc = acc * tl.exp(m - shift) + tl.exp(x - shift)",
                "m = new_m"]
        final = ["row_max = tl.max(m, axis=1)",
                 "row_shift = tl.where(row_max == float(\"-inf\"), 0.0, row_max)",
                 "value = row_shift + tl.log(tl.sum(acc * tl.exp(m - row_shift[:, None]), axis=1))"]
    elif op in ("max", "min"):
        init = [f"acc = tl.full({tile}, {FILL[op]}, tl.float32)"]
        step = [f"acc = tl.{'maximum' if op == 'max' else 'minimum'}(acc, x)"]
        final = [f"value = tl.{op}(acc, axis=1)"]
    else:
        extreme = INDEX_OPS[op]
        init = [f"best = tl.full({tile}, {FILL[op]}, tl.float32)",
                f"best_col = tl.zeros({tile}, dtype=tl.int32)"]
        step = [f"better = x {'>' if extreme == 'max' else '<'} best  # strict: each lane keeps its first extreme",
                "best_col = tl.where(better, cols[None, :], best_col)",
                "best = tl.where(better, x, best)"]
        final = [f"row_best = tl.{extreme}(best, axis=1)",
                 "# the first column holding the row's extreme",
                 "value = tl.min(tl.where(best == row_best[:, None], best_col, N), axis=1)"]
    return [*init, *t.chunks([*load, *step]), *final]


FAMILY = ReductionFamily()
