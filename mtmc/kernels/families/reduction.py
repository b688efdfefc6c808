"""Row reductions: sum, mean, max, min, argmax, argmin over the last dim of x [M, N] -> [M], or
over the middle dim of x's buffer seen as [M / inner, N, inner] (params "inner", see _rows).

Looped kernels keep a [ROWS_PER_PROG, BLOCK_N] accumulator (one running value per lane) and
reduce it across lanes once at the end, so each chunk costs only elementwise work.
"""
from __future__ import annotations

from mtmc.kernels.families import _rows
from mtmc.kernels.family import TensorArg
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import KernelSpec

INDEX_OPS = {"argmax": "max", "argmin": "min"}
# Padding value that can never win or count, per op.
FILL = {"sum": "0.0", "mean": "0.0", "max": 'float("-inf")', "min": 'float("inf")',
        "argmax": 'float("-inf")', "argmin": 'float("inf")'}
TORCH = {"sum": "torch.sum", "mean": "torch.mean", "max": "torch.amax", "min": "torch.amin",
         "argmax": "torch.argmax", "argmin": "torch.argmin"}

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
        _rows.validate_rows(spec, {"prologue", "inner"}, epilogue=False)

    def output(self, spec: KernelSpec) -> TensorArg:
        return TensorArg("out", ("M",), "int64" if spec.op in INDEX_OPS else None)

    def reference_source(self, spec: KernelSpec) -> str:
        rows = self.layout(spec)
        flat = ".reshape(-1)" if rows.inner > 1 else ""  # [P, Q] results in the kernel's row order
        parts = [rows.ref_function("reference", [f"return {TORCH[spec.op]}(x, dim={rows.red_dim}){flat}"])]
        if spec.op in ("sum", "mean"):
            # accumulation-order error grows with the sum of |x|, not with |sum x|
            reduce = "sum" if spec.op == "sum" else "mean"
            parts.append(rows.ref_function("error_scale", [f"return x.abs().{reduce}(dim={rows.red_dim}){flat}"]))
        if spec.op in INDEX_OPS:
            tol = 1e-5 if rows.prologue else 0.0   # no prologue: the kernel compares exact values
            largest = INDEX_OPS[spec.op] == "max"
            parts += [_INDEX_JUDGE,
                      rows.ref_function("compare", [f"return _judge_index(out, x, {largest}, {tol})"], ("out",),
                                        logical=True)]
        return rows.helpers() + "\n\n".join(parts)

    def render(self, spec: KernelSpec, config: dict) -> str:
        t = _rows.RowTemplate(self.layout(spec), config, f"{spec.op}_rows_kernel", out_rows_only=True)
        load = t.load_x(FILL[spec.op])
        body = _single_pass(spec.op, t, load) if t.single else _looped(spec.op, t, load)
        title = (f"{spec.op} over the last dim of x [M, N] -> out [M]" if not t.strided
                 else f"{spec.op} over dim 1 of x [M / Q, N, Q] -> out [M]")
        return t.module(title, body + [t.store("value")])

    def work(self, spec: KernelSpec) -> tuple[float, float]:
        return self.layout(spec).work(1.0, self.output(spec))



def _single_pass(op: str, t: _rows.RowTemplate, load: list[str]) -> list[str]:
    reduce = {"sum": "tl.sum(x, axis=1)", "mean": "tl.sum(x, axis=1) / N", "max": "tl.max(x, axis=1)",
              "min": "tl.min(x, axis=1)", "argmax": "tl.argmax(x, axis=1)", "argmin": "tl.argmin(x, axis=1)"}[op]
    return t.chunks([*load, f"value = {reduce}"])


def _looped(op: str, t: _rows.RowTemplate, load: list[str]) -> list[str]:
    tile = "[ROWS_PER_PROG, BLOCK_N]"
    if op in ("sum", "mean"):
        init = [f"acc = tl.zeros({tile}, dtype=tl.float32)"]
        step = ["acc += x"]
        final = ["value = tl.sum(acc, axis=1)" + (" / N" if op == "mean" else "")]
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
