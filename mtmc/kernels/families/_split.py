"""Split reductions: a few long rows (x.sum(), torch.max(x) with no dim: M = 1) shared by many
programs, so the whole GPU reads them.

Pass 1: program (row group, segment) reduces its segment of L columns (a multiple of BLOCK_N,
L = cdiv(cdiv(N, SPLIT), BLOCK_N) * BLOCK_N, so at most SPLIT segments) with the reduction
family's own looped body (kernels.families.reduction, prologue included) and writes one fp32
partial to a small [M, segments] buffer (a mean's partials are already divided by the full N).
Pass 2 is one row program per row: the reduction family's own kernel over the partials (sum for
sum and mean, the op itself for max / min / prod / logsumexp), with the spec's epilogue.  No
atomics: the partials are combined in a fixed order, so the result is the same on every run
(the loss family's two passes, kernels.families.loss, do the same for its sums).

argmax / argmin: pass 1 stores each segment's (extreme, its first column) pair, both as float64
(exact for fp32 values and for indices below 2**53) in one [M, 2 * segments] buffer; pass 2 picks
the extreme of the pairs and, among the segments holding it, the least column: the first extreme
in order, so ties resolve as in torch.
"""
from __future__ import annotations

from mtmc.kernels.families import _rows
from mtmc.kernels.families.elementwise import IMPORTS, INTERPRETED_SOURCE, interpreter_ints
from mtmc.kernels.spec import KernelSpec

# SPLIT values offered; the default aims at this many programs per SM in pass 1.
SPLITS = [1, 4, 16, 64, 256, 1024]
PROGRAMS_PER_SM = 4
# Pass 1 gives each segment at least this many BLOCK_N chunks (fewer: the partials cost more
# than they save).
MIN_CHUNKS = 4
# Ops whose partials combine with an op of the same family ("mean" partials are pre-divided sums).
COMBINE = {"sum": "sum", "mean": "sum", "max": "max", "min": "min", "prod": "prod", "logsumexp": "logsumexp"}
INDEX = {"argmax": "max", "argmin": "min"}   # (value, column) pairs, combined by PICK_SOURCE
# Only rows this few are split (more rows already fill the GPU one program each).
MAX_ROWS = 64


def splittable(spec: KernelSpec) -> bool:
    return (spec.op in COMBINE or spec.op in INDEX) and int(spec.params.get("inner", 1)) == 1 and spec.dims["M"] <= MAX_ROWS


def default_split(spec: KernelSpec, block_n: int, hw) -> int:
    """The least SPLIT giving PROGRAMS_PER_SM programs an SM, while segments keep MIN_CHUNKS chunks."""
    if not splittable(spec):
        return 1
    sms = getattr(hw, "sms", None) or 132
    M, N = spec.dims["M"], spec.dims["N"]
    best = 1
    for s in SPLITS:
        if N // s < MIN_CHUNKS * block_n:
            break
        best = s
        if M * s >= PROGRAMS_PER_SM * sms:
            break
    return best


class SplitTemplate(_rows.RowTemplate):
    """The row template with the columns of each row cut into segments, one per program along
    grid axis 1; stores one partial per (row, segment)."""

    def __init__(self, rows: _rows.Rows, config: dict, kernel_name: str):
        super().__init__(rows, {**config, "ROWS_PER_PROG": 1, "PERSISTENT": False}, kernel_name, out_rows_only=True)
        self.single = False   # a segment is always walked in chunks

    def chunks(self, body: list[str], comment: str = "") -> list[str]:
        head = "for start in range(seg_lo, seg_hi, BLOCK_N):" + (f"  # {comment}" if comment else "")
        return [head, *_rows.indent(["cols = start + tl.arange(0, BLOCK_N)",
                                     "col_mask = cols < seg_hi", "mask = row_mask[:, None] & col_mask[None, :]",
                                     *body])]

    def store(self, var: str, at: str = "seg") -> str:
        return f"tl.store(out_ptr + rows64 * stride_out + {at}, {var}.to(out_ptr.dtype.element_ty), mask=row_mask)"

    def kernel(self, body: list[str]) -> list[str]:
        segment = ["seg = tl.program_id(1)",
                   "seg_lo = seg * L",
                   "seg_hi = tl.minimum(seg_lo + L, N)",
                   *interpreter_ints(["seg_lo", "seg_hi"])]
        lines = super().kernel([*segment, *body])
        return [line.replace("        M, N, ", "        M, N, L, ", 1) for line in lines]

    def loops(self) -> bool:
        return True

    def launch_pass1(self, pairs: bool = False) -> list[str]:
        names = self.rows.names()
        strides = [f"{n}.stride(0)" for n in self._full_names()]
        c = self.config
        return ["    M, N = x.shape",
                f"    L = triton.cdiv(triton.cdiv(N, {c['SPLIT']}), {c['BLOCK_N']}) * {c['BLOCK_N']}  # segment length",
                "    segments = triton.cdiv(N, L)",
                ("    partial = torch.empty((M, 2 * segments), dtype=torch.float64, device=x.device)  # values, columns"
                 if pairs else "    partial = torch.empty((M, segments), dtype=torch.float32, device=x.device)"),
                f"    {self.kernel_name}[(M, segments)](",
                f"        {', '.join([*names, 'partial', 'M', 'N', 'L', *strides, 'partial.stride(0)'])},",
                f"        BLOCK_N={c['BLOCK_N']}, ROWS_PER_PROG=1, num_warps={c['num_warps']}, "
                f"num_stages={c['num_stages']})"]


PICK_SOURCE = """
@triton.jit
def pick_kernel(partial_ptr, out_ptr, segments, stride_p, BLOCK: tl.constexpr, LARGEST: tl.constexpr):
    # one row: the extreme of its segments' values, then the least column among those holding it
    row = tl.program_id(0).to(tl.int64)
    seg = tl.arange(0, BLOCK)
    ok = seg < segments
    col = tl.load(partial_ptr + row * stride_p + segments + seg, mask=ok, other=0.0)
    if LARGEST:
        v = tl.load(partial_ptr + row * stride_p + seg, mask=ok, other=float("-inf"))
        best = tl.max(v, axis=0)
    else:
        v = tl.load(partial_ptr + row * stride_p + seg, mask=ok, other=float("inf"))
        best = tl.min(v, axis=0)
    big = 9.0e15   # above any column
    first = tl.min(tl.where(ok & (v == best), col, big), axis=0)
    first = tl.where(first == big, 0.0, first)   # a row of fills only: column 0, as torch
    tl.store(out_ptr + row, first.to(tl.int64))
"""


def _render_pairs(spec: KernelSpec, t: SplitTemplate, body: list[str]) -> str:
    """argmax / argmin split: pass 1 stores (extreme, first column) per segment, pass 2 picks."""
    extreme = INDEX[spec.op]
    # _looped leaves row_best (the segment's extreme) beside value (its first column)
    first = t.kernel([*body, "segments = (N + L - 1) // L", t.store("row_best"), t.store("value", "segments + seg")])
    names = t.rows.names()
    block = max(16, 1 << max(int(t.config["SPLIT"]) - 1, 1).bit_length())
    launch = [f"def launch({', '.join(names)}, *, out):", *t.launch_pass1(pairs=True),
              f"    pick_kernel[(M,)](partial, out, segments, partial.stride(0), BLOCK={block}, "
              f"LARGEST={extreme == 'max'}, num_warps=1)"]
    header = [f"# pass 1: {spec.op} of each row's segments (SPLIT={t.config['SPLIT']}) -> (extreme, first column) "
              "pairs in float64; pass 2: the first extreme in column order", IMPORTS.rstrip("\n")]
    return "\n".join([*header, "import os", "", INTERPRETED_SOURCE.strip("\n"), "", PICK_SOURCE, "",
                      *first, "", "", *launch]) + "\n"


def render(family, spec: KernelSpec, config: dict, pass1_body, fill: str) -> str:
    """The two-pass module.  pass1_body(op, template, load) gives the reduction family's looped
    body for one op (padding lanes hold `fill`); the family's own render writes pass 2 over the
    partials."""
    t = SplitTemplate(family.layout(spec), config, f"{spec.op}_split_kernel")
    t.config["SPLIT"] = config["SPLIT"]
    body = pass1_body(spec.op, t, t.load_x(fill))
    if spec.op in INDEX:
        return _render_pairs(spec, t, body)
    first = t.kernel([*body, t.store("value")])
    finish_spec = KernelSpec("reduction", COMBINE[spec.op], {"M": spec.dims["M"], "N": config["SPLIT"]}, "float32",
                             {"epilogue": spec.params["epilogue"]} if spec.params.get("epilogue") else {})
    block = max(_rows.MIN_BLOCK_N, _rows.next_pow2(config["SPLIT"]))
    finish_cfg = {"BLOCK_N": block, "num_warps": _rows.warps_for(block), "num_stages": 1, "ROWS_PER_PROG": 1,
                  "PERSISTENT": False, "SPLIT": 1}
    second = family.render(finish_spec, finish_cfg).replace("def launch(", "def finish_launch(", 1)
    header = [f"# pass 1: {spec.op} of each row's segments (SPLIT={config['SPLIT']}) -> fp32 partials; "
              f"pass 2: {COMBINE[spec.op]} of the partials in a fixed order"]
    names = t.rows.names()
    launch = [f"def launch({', '.join(names)}, *, out):", *t.launch_pass1(),
              "    finish_launch(partial, out=out)"]
    return "\n".join([*header, second, "import os", "", INTERPRETED_SOURCE.strip("\n"), "", "",
                      *first, "", "", *launch]) + "\n"
