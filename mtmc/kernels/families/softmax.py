"""Softmax and log-softmax over the last dim of x [M, N] -> [M, N], or over the middle dim of
x's buffer seen as [M / inner, N, inner] (params "inner", see _rows: softmax over the channels
of NCHW, read in place, coalesced along the inner dim; the output lies in x's own order).

params: "scale" (logits are multiplied by it first, as in scaled attention; default 1.0),
"inner", "prologue" / "epilogue" pointwise chains.  Looped kernels make two passes: an online pass
keeping the running max and the sum rescaled to it, then a pass that normalizes and stores.
"""
from __future__ import annotations

from mtmc.kernels.families import _rows
from mtmc.kernels.family import TensorArg
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import KernelSpec

NEG_INF = 'float("-inf")'
# Strided default: the softmax dim stays whole in one tile up to this length (else it loops over
# chunks with an online max and sum), and a tile holds about STRIDED_TILE values.
STRIDED_SINGLE_LIMIT = 512
STRIDED_TILE = 4096
STRIDED_MIN_ROWS = 16


class SoftmaxFamily(_rows.RowFamily):
    name = "softmax"
    ops = FAMILY_OPS["softmax"]

    def describe(self, spec: KernelSpec) -> str:
        text = self.layout(spec).describe(spec.op)
        scale = _scale(spec)
        return text + (f", logits scaled by {scale:g}" if scale != 1.0 else "")

    def validate(self, spec: KernelSpec) -> None:
        super().validate(spec)
        _rows.validate_rows(spec, {"prologue", "epilogue", "scale", "inner"}, epilogue=True)
        _scale(spec)

    def output(self, spec: KernelSpec) -> TensorArg:
        return TensorArg("out", ("M", "N"))

    def reference_source(self, spec: KernelSpec) -> str:
        rows = self.layout(spec)
        dim = rows.red_dim
        op = [f"z = x * {_scale(spec)!r}", f"y = torch.{spec.op}(z, dim={dim})"]
        # log_softmax = z - logsumexp(z): its rounding error follows both terms, not their difference
        scale = [f"s = z.abs() + torch.logsumexp(z, dim={dim}, keepdim=True).abs()" if spec.op == "log_softmax"
                 else "s = y.abs()"]
        return rows.ref_sources(op, scale, full_out=True)

    def default_config(self, spec: KernelSpec, hw) -> dict:
        """Over a middle dim: the whole softmax dim in one tile when it is short (one read of x),
        as many neighbouring inner columns as keep the tile near 4K values; long dims loop."""
        inner = int(spec.params.get("inner", 1))
        if inner == 1:
            return _rows.default_config(spec, hw)
        block = max(_rows.MIN_BLOCK_N, _rows.next_pow2(spec.dims["N"]))
        if block > STRIDED_SINGLE_LIMIT:
            return _rows.default_config(spec, hw)
        # at least STRIDED_MIN_ROWS neighbouring columns: each row's load is a whole 32-byte sector or more
        tile = max(STRIDED_TILE, STRIDED_MIN_ROWS * block)
        fits = [r for r in _rows.INNER_ROWS_PER_PROG if r * block <= tile and r <= max(4, inner)]
        rows = max(fits, default=_rows.INNER_ROWS_PER_PROG[0])
        return {"BLOCK_N": block, "num_warps": _rows.warps_for(rows * block), "num_stages": 1,
                "ROWS_PER_PROG": rows, "PERSISTENT": False}

    def render(self, spec: KernelSpec, config: dict) -> str:
        t = _rows.RowTemplate(self.layout(spec), config, f"{spec.op}_kernel", out_rows_only=False)
        scale = _scale(spec)
        steps = ({"op": "scale", "value": scale},) if scale != 1.0 else ()
        load = t.load_x(NEG_INF, steps)
        body = _single_pass(spec.op, t, load) if t.single else _looped(spec.op, t, load)
        where = "dim 1 of x [M / Q, N, Q]" if t.strided else "the last dim of x [M, N]"
        title = f"{spec.op} over {where}" + (f", logits scaled by {scale!r}" if steps else "")
        return t.module(title, body)

    def work(self, spec: KernelSpec) -> tuple[float, float]:
        # scale, max, subtract, exp, sum, divide
        return self.layout(spec).work(6.0, self.output(spec))



def _scale(spec: KernelSpec) -> float:
    return _rows.number_param(spec, "scale", 1.0)


def _finish(t: _rows.RowTemplate, y: str) -> list[str]:
    return [f"y = {y}", *t.epilogue("y"), t.store("y")]


def _single_pass(op: str, t: _rows.RowTemplate, load: list[str]) -> list[str]:
    stats = ["row_max = tl.max(x, axis=1)",
             "num = tl.exp(x - row_max[:, None])",
             "denom = tl.sum(num, axis=1)"]
    y = ("num * (1.0 / denom)[:, None]" if op == "softmax"
         else "x - (row_max + tl.log(denom))[:, None]")
    return t.chunks([*load, *stats, *_finish(t, y)])


def _looped(op: str, t: _rows.RowTemplate, load: list[str]) -> list[str]:
    online = [*load,
              "new_max = tl.maximum(row_max, tl.max(x, axis=1))",
              "denom = denom * tl.exp(row_max - new_max) + tl.sum(tl.exp(x - new_max[:, None]), axis=1)",
              "row_max = new_max"]
    if op == "softmax":
        between, y = ["inv_denom = 1.0 / denom"], "tl.exp(x - row_max[:, None]) * inv_denom[:, None]"
    else:
        between, y = ["log_norm = row_max + tl.log(denom)"], "x - log_norm[:, None]"
    return ["row_max = tl.full([ROWS_PER_PROG], float(\"-inf\"), tl.float32)",
            "denom = tl.zeros([ROWS_PER_PROG], dtype=tl.float32)",
            *t.chunks(online, "pass 1: running max and the sum rescaled to it"),
            *between,
            *t.chunks([*load, *_finish(t, y)], "pass 2: normalize and store")]


FAMILY = SoftmaxFamily()
