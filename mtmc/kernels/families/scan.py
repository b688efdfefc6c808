"""Scans: cumsum and cumprod along the rows of x [M, N] -> [M, N].

params: "reverse" (scan from the end of each row: torch.cumsum(x.flip(d), d).flip(d)),
"exclusive" (element j gets the scan of elements before j: cumsum(x) - x, a shifted scan),
"masked" (a bool [M, N] input `mask` after x; masked-out elements count as 0, as x * mask does),
"inner" (Q > 1: a scan over a middle dim, x's buffer read in place as [M / Q, N, Q], as
reductions do, see _rows), "prologue" / "epilogue" pointwise chains (not with "inner").

How: one program owns ROWS_PER_PROG rows and walks them in BLOCK_N chunks; each chunk is scanned
in registers with tl.cumsum / tl.associative_scan and offset by a running carry (the combine of
all earlier chunks), so memory is read once and written once with fp32 accumulation.  Few long
rows cannot fill the GPU that way, so SPLIT > 1 cuts each row into SPLIT segments scanned side by
side (a two-level scan): a first kernel reduces every segment to its total (one read), the second
starts each segment from the combine of the totals before it and scans it (a read and a write).
Reverse and exclusive scans change only which element a position loads: the scan runs over the
logical order, loads and stores go to the mirrored (reverse) or shifted-by-one (exclusive) place.
"""
from __future__ import annotations

from mtmc.kernels import pointwise
from mtmc.kernels.families import _rows
from mtmc.kernels.families.elementwise import (
    IMPORTS, INTERPRETED_SOURCE, indent, interpreter_ints, signature, step_lines,
)
from mtmc.kernels.family import TensorArg, small_dim
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import KernelSpec

# op -> (identity, Triton chunk scan, Triton chunk combine (a [R] value per row), combine of two)
OPS = {
    "cumsum": ("0.0", "tl.cumsum({v}, axis=1)", "tl.sum({v}, axis=1)", "{a} + {b}"),
    "cumprod": ("1.0", "tl.associative_scan({v}, 1, _mul)", "tl.reduce({v}, 1, _mul)", "{a} * {b}"),
}
_MUL = "@triton.jit\ndef _mul(a, b):\n    return a * b\n"
BLOCKS = [32, 64, 128, 256, 512, 1024, 2048, 4096]
SPLITS = [1, 2, 4, 8, 16, 32, 64]
# A program's tile holds about this many elements: scans keep a few live copies of it.
TILE = 2048
# The default cuts rows into segments until the grid has this many programs per SM.
WAVES = 4
# fp32 rounding unit: a product of j factors carries up to ~j of them (cumprod's error scale)
FP32_UNIT = 2.0 ** -24


class Scan(_rows.Rows):
    """The tensors of a scan spec: x, the bool mask when masked, then the chains' operands."""

    def inputs(self) -> list[TensorArg]:
        args = super().inputs()
        if self.spec.params.get("masked"):
            args.insert(1, TensorArg("mask", ("M", "N"), "bool", init="mask"))
        return args


def _flag(spec: KernelSpec, key: str) -> bool:
    value = spec.params.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"params {key!r} must be true or false, got {value!r}")
    return value


class ScanFamily(_rows.RowFamily):
    name = "scan"
    ops = FAMILY_OPS["scan"]

    def layout(self, spec: KernelSpec) -> Scan:
        return Scan(spec)

    def describe(self, spec: KernelSpec) -> str:
        p = spec.params
        kind = " ".join(w for w, on in (("reverse", p.get("reverse")), ("exclusive", p.get("exclusive")),
                                        ("masked", p.get("masked"))) if on)
        return self.layout(spec).describe(f"{kind} {spec.op}".strip())

    def validate(self, spec: KernelSpec) -> None:
        super().validate(spec)
        _rows.validate_rows(spec, {"prologue", "epilogue", "inner", "reverse", "exclusive", "masked"}, epilogue=True)
        for key in ("reverse", "exclusive", "masked"):
            _flag(spec, key)
        if spec.params.get("inner", 1) > 1 and (spec.params.get("prologue") or spec.params.get("epilogue")):
            raise ValueError("a scan over a middle dim (inner) takes no pointwise chains")

    def output(self, spec: KernelSpec) -> TensorArg:
        return TensorArg("out", ("M", "N"))

    # -- reference --
    def reference_source(self, spec: KernelSpec) -> str:
        rows = self.layout(spec)
        p, d = spec.params, rows.red_dim
        ident = OPS[spec.op][0]
        lines = ["x = torch.where(mask, x, torch.zeros_like(x))"] if p.get("masked") else []
        if p.get("reverse"):
            lines.append(f"x = x.flip({d})")
        # the exclusive scan is the inclusive scan of x shifted by one (the identity first)
        shift = [f"x = torch.cat([torch.full_like(x.narrow({d}, 0, 1), {ident}), x.narrow({d}, 0, x.shape[{d}] - 1)], "
                 f"dim={d})"] if p.get("exclusive") else []
        back = (lambda v: f"{v}.flip({d})") if p.get("reverse") else (lambda v: v)
        flat = (lambda v: f"{v}.reshape(-1, {spec.dims['N']})") if rows.inner > 1 else (lambda v: v)
        op = [*lines, *shift, f"y = {flat(back(f'torch.{spec.op}(x, dim={d})'))}"]
        if spec.op == "cumsum":   # rounding error grows with the running sum of |x|, not with |cumsum|
            scale = [f"s = {flat(back(f'torch.cumsum(x.abs(), dim={d})'))}"]
        else:                     # a product of j factors carries ~j roundings of its magnitude
            steps = f"torch.arange(1, x.shape[{d}] + 1, dtype=x.dtype, device=x.device)"
            view = ".reshape(-1, 1)" if rows.inner > 1 else ""
            scale = [f"s = {flat(back(f'torch.cumprod(x, dim={d}).abs() * (1 + {steps}{view} * {FP32_UNIT / 1e-4!r})'))}"]
        return rows.ref_sources(op, scale)

    # -- how --
    def config_space(self, spec: KernelSpec) -> dict[str, list]:
        n = spec.dims["N"]
        strided = spec.params.get("inner", 1) > 1
        top = min(max(_rows.next_pow2(n), BLOCKS[0]), BLOCKS[-1])
        return {"BLOCK_N": [b for b in BLOCKS if b <= top],
                "ROWS_PER_PROG": list(_rows.INNER_ROWS_PER_PROG if strided else [1, 2, 4, 8, 16, 32]),
                "SPLIT": [s for s in SPLITS if s == 1 or s * BLOCKS[0] <= n],
                "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3, 4]}

    def default_config(self, spec: KernelSpec, hw) -> dict:
        M, N = spec.dims["M"], spec.dims["N"]
        sms = getattr(hw, "sms", None) or 132
        inner = spec.params.get("inner", 1)
        if inner > 1:   # neighbouring q as rows: coalesced loads across the tile's rows
            rows = max(r for r in _rows.INNER_ROWS_PER_PROG if r <= max(4, min(inner, 64)))
            block = min(max(BLOCKS[0], _rows.next_pow2(N)), max(BLOCKS[0], TILE // rows))
        else:
            block = min(max(BLOCKS[0], _rows.next_pow2(N)), TILE)
            rows = 1
            for r in (2, 4, 8, 16, 32):   # short rows: several to a program while the grid stays full
                if r * block <= TILE and -(-M // r) >= WAVES * sms:
                    rows = r
        groups = -(-M // rows)
        split = 1
        chunks = -(-N // block)
        while split < SPLITS[-1] and groups * split < WAVES * sms and chunks >= 4 * split:
            split *= 2
        tile = rows * block
        return {"BLOCK_N": block, "ROWS_PER_PROG": rows, "SPLIT": split,
                "num_warps": 8 if tile >= 2048 else 4 if tile >= 512 else 2, "num_stages": 2}

    def check_dims(self, spec: KernelSpec, config: dict) -> dict[str, int]:
        """Two row groups plus a partial one; columns: >= 2 chunks per segment plus the real tail."""
        rows, block, split = config["ROWS_PER_PROG"], config["BLOCK_N"], config["SPLIT"]
        inner = spec.params.get("inner", 1)
        n = small_dim(spec.dims["N"], block, 2 * split)
        if inner > 1:
            return {"M": inner * min(spec.dims["M"] // inner, 2), "N": n}
        return {"M": min(spec.dims["M"], 2 * rows + max(1, rows // 2)), "N": n}

    def work(self, spec: KernelSpec) -> tuple[float, float]:
        return self.layout(spec).work(2.0, self.output(spec))

    def render(self, spec: KernelSpec, config: dict) -> str:
        cfg = {k: config[k] for k in self.config_space(spec)}
        return _Render(self.layout(spec), cfg).module()


class _Render:
    """The two kernels (segment totals, scan) and the launcher of one scan spec and config."""

    def __init__(self, rows: Scan, config: dict):
        self.rows, self.c, self.spec = rows, config, rows.spec
        self.ident, self.scan, self.reduce, self.combine = OPS[self.spec.op]
        self.names = rows.names()
        p = self.spec.params
        self.reverse, self.exclusive, self.masked = p.get("reverse"), p.get("exclusive"), p.get("masked")

    def _phys(self, logical: str) -> str:
        """The column an element of the scan order lives in."""
        return f"(N - 1 - {logical})" if self.reverse else logical

    @staticmethod
    def _chain(chain: list[dict], operands: list, var: str, offs: str, col: str, mask: str) -> list[str]:
        """Load a chain's operands where the elements live ([N] vectors at their column, one value
        once), apply it to `var`."""
        lines = []
        for o in operands:
            where = (pointwise.periodic_offsets(o.chain_step, offs) if o.kind == "periodic"
                     else {"full": offs, "vector": f"{col}[None, :]"}.get(o.kind))
            lines.append(pointwise.operand_load(o.name, o.chain_step, where, mask))
        return [*lines, *step_lines(chain, var, _rows.Rows.step_names(operands))]

    def _head(self) -> list[str]:
        return ["group, seg = tl.program_id(0), tl.program_id(1)",
                "rows = group * ROWS_PER_PROG + tl.arange(0, ROWS_PER_PROG)",
                "row_mask = rows < M",
                "rows64 = rows.to(tl.int64)  # element offsets can pass 2**31",
                "base = (rows64 // Q) * N * Q + rows64 % Q  # row (p, q) of the [M / Q, N, Q] buffer (Q = 1: rows)",
                "lo = seg * SEG  # this program's segment of the scan order",
                "hi = tl.minimum(lo + SEG, N)",
                *interpreter_ints(["lo", "hi"])]

    def _load(self) -> list[str]:
        """fp32 values `v` of the chunk at scan positions pos (identity where there is none)."""
        src = "pos - 1" if self.exclusive else "pos"
        lines = ["pos = start + tl.arange(0, BLOCK_N)",
                 f"src = {src}" + ("  # exclusive: each position takes the element before it" if self.exclusive else ""),
                 "valid = row_mask[:, None] & ((src >= 0) & (pos < hi))[None, :]",
                 f"col = {self._phys('src')}",
                 "offs = base[:, None] + col[None, :].to(tl.int64) * Q",
                 "x = tl.load(x_ptr + offs, mask=valid, other=0.0).to(tl.float32)"]
        if self.rows.prologue:
            lines += self._chain(self.rows.prologue, self.rows.pro_operands, "x", "offs", "col", "valid")
        if self.masked:
            lines.append("x = tl.where(tl.load(mask_ptr + offs, mask=valid, other=0) != 0, x, 0.0)")
        lines.append(f"v = tl.where(valid, x, {self.ident})")
        return lines

    def _signature(self, kernel: str, last: list[str]) -> list[str]:
        ptrs = [f"{n}_ptr" for n in self.names]
        return ["@triton.jit",
                signature(kernel, [*ptrs, *last, "M", "N", "Q", "SEG", "BLOCK_N: tl.constexpr",
                                   "ROWS_PER_PROG: tl.constexpr", "SPLIT: tl.constexpr"])]

    def totals_kernel(self) -> list[str]:
        body = [*self._head(),
                f"acc = tl.full([ROWS_PER_PROG], {self.ident}, tl.float32)",
                "for start in range(lo, hi, BLOCK_N):",
                *indent([*self._load(), f"acc = {self.combine.format(a='acc', b=self.reduce.format(v='v'))}"]),
                "tl.store(totals_ptr + rows64 * SPLIT + seg, acc, mask=row_mask)"]
        return [*self._signature("scan_totals_kernel", ["totals_ptr"]), *indent(body)]

    def scan_kernel(self) -> list[str]:
        epi = self.rows.epilogue
        out = [f"y = {self.combine.format(a='carry[:, None]', b=self.scan.format(v='v'))}"]
        if epi:
            out += self._chain(epi, self.rows.epi_operands, "y", "out_offs", "out_col", "keep")
        body = [*self._head(),
                f"carry = tl.full([ROWS_PER_PROG], {self.ident}, tl.float32)",
                "if SPLIT > 1:  # start from the combine of the totals of the segments before this one",
                "    segs = tl.arange(0, SPLIT)",
                "    before = tl.load(totals_ptr + rows64[:, None] * SPLIT + segs[None, :],",
                f"                     mask=row_mask[:, None] & (segs < seg)[None, :], other={self.ident})",
                f"    carry = {self.reduce.format(v='before')}",
                "for start in range(lo, hi, BLOCK_N):",
                *indent([*self._load(),
                         f"out_col = {self._phys('pos')}",
                         "out_offs = base[:, None] + out_col[None, :].to(tl.int64) * Q",
                         "keep = row_mask[:, None] & (pos < hi)[None, :]",
                         *out,
                         "tl.store(out_ptr + out_offs, y.to(out_ptr.dtype.element_ty), mask=keep)",
                         f"carry = {self.combine.format(a='carry', b=self.reduce.format(v='v'))}"])]
        return [*self._signature("scan_kernel", ["out_ptr", "totals_ptr"]), *indent(body)]

    def launch(self) -> list[str]:
        c, inner = self.c, self.rows.inner
        full = [a.name for a in self.rows.inputs() if len(a.shape) == 2]
        lines = ["M, N = x.shape",
                 f"Q = {inner}" + ("  # x's buffer is [M / Q, N, Q]" if inner > 1 else ""),
                 f"assert all(t.is_contiguous() for t in ({', '.join([*full, 'out'])},)), "
                 "'the scan reads and writes contiguous rows'",
                 f"split = max(1, min({c['SPLIT']}, triton.cdiv(N, {c['BLOCK_N']})))",
                 f"seg = triton.cdiv(triton.cdiv(N, split), {c['BLOCK_N']}) * {c['BLOCK_N']}  # whole chunks",
                 "split = triton.cdiv(N, seg)",
                 f"grid = (triton.cdiv(M, {c['ROWS_PER_PROG']}), split)",
                 "totals = torch.empty((M, 1 if split == 1 else triton.next_power_of_2(split)), "
                 "dtype=torch.float32, device=x.device)",
                 f"meta = dict(BLOCK_N={c['BLOCK_N']}, ROWS_PER_PROG={c['ROWS_PER_PROG']}, SPLIT=totals.shape[1], "
                 f"num_warps={c['num_warps']}, num_stages={c['num_stages']})",
                 "if split > 1:  # pass 1: each segment's total",
                 f"    scan_totals_kernel[grid]({', '.join(self.names)}, totals, M, N, Q, seg, **meta)",
                 f"scan_kernel[grid]({', '.join(self.names)}, out, totals, M, N, Q, seg, **meta)"]
        return [signature("launch", [*self.names, "*", "out"]), *indent(lines)]

    def module(self) -> str:
        c = self.c
        header = [f"# MTMC kernel: {ScanFamily().describe(self.spec)}",
                  f"# config: BLOCK_N={c['BLOCK_N']} ROWS_PER_PROG={c['ROWS_PER_PROG']} SPLIT={c['SPLIT']} "
                  f"num_warps={c['num_warps']} num_stages={c['num_stages']}",
                  "# each program scans its rows' segment chunk by chunk, carrying the running "
                  + ("sum" if self.spec.op == "cumsum" else "product")
                  + "; SPLIT > 1 first reduces every segment to its total (a two-level scan)"]
        mul = [_MUL] if self.spec.op == "cumprod" else []
        parts = ["\n".join(header) + "\nimport os\n" + IMPORTS, INTERPRETED_SOURCE.strip("\n"), *mul,
                 "\n".join(self.totals_kernel()), "\n".join(self.scan_kernel()), "\n".join(self.launch())]
        return "\n\n\n".join(p.strip("\n") for p in parts) + "\n"


FAMILY = ScanFamily()
