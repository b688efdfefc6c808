"""Shared pieces of the row-wise families (reduction, softmax, norm).

All three read x [M, N] and work along the last dim N.  One program owns ROWS_PER_PROG rows, a
[ROWS_PER_PROG, BLOCK_N] tile.  A reduction over a middle dim (params "inner" = Q > 1) reads x's
buffer as [M / Q, N, Q] instead: row m = (p, q) has its N values Q elements apart, and a program's
ROWS_PER_PROG rows are neighbouring q, so every load is contiguous across the tile's rows (no
transposed copy of x is ever made).  When BLOCK_N covers N the whole row is one tile held in
registers (single pass); otherwise the kernel loops over column chunks.  PERSISTENT launches a
fixed grid of a few programs per SM that walk the row groups with a grid stride.

Optional pointwise chains (kernels.pointwise) run elementwise on x before the op ("prologue")
and on the op's output ("epilogue"); every chain operand is one more input tensor, named as
pointwise.operands() names it ("residual0"), with "epi_" in front for epilogue operands so the
two chains never collide.  Input order: x, prologue operands, the family's own [N] vectors
(norm weight and bias), epilogue operands.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mtmc.kernels import pointwise
from mtmc.kernels.families.elementwise import INTERPRETED_SOURCE, interpreter_ints, step_lines
from mtmc.kernels.family import CPU_SMS, DTYPE_BYTES, PROGRAMS_PER_SM, Family, TensorArg, small_dim
from mtmc.kernels.spec import DTYPES, KernelSpec

MIN_BLOCK_N = 32
# Largest tile offered: 32K fp32 values over 16 warps is already 64 registers a thread per copy.
MAX_BLOCK_N = 32768
# The default keeps rows up to this long whole in registers, and loops in LOOP_BLOCK_N chunks above.
SINGLE_PASS_LIMIT = 16384
LOOP_BLOCK_N = 4096
# The default packs short rows together until a program's tile holds about this many elements.
PACKED_TILE = 2048
WARPS = [1, 2, 4, 8, 16]
STAGES = [1, 2, 3, 4]
ROWS_PER_PROG = [1, 2, 4, 8]
# Strided ("inner") layout: a program's rows are neighbouring q, so wide tiles coalesce the loads.
INNER_ROWS_PER_PROG = [4, 8, 16, 32, 64, 128]
INNER_TILE = 2048
# The default turns PERSISTENT on past this many row groups per SM (several full waves of
# programs, where per-program launch and scheduling cost starts to show).
PERSISTENT_WAVES = 32
CHUNK_LOOP = "for start in range(0, N, BLOCK_N):"


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def indent(lines: list[str], levels: int = 1) -> list[str]:
    pad = "    " * levels
    return [pad + line if line else line for line in lines]


# -- spec checks ----------------------------------------------------------------------------

def validate_rows(spec: KernelSpec, allowed_params: set[str], epilogue: bool) -> None:
    """Checks every row family shares: dims M and N, dtype, known params, valid chains."""
    if "inner" in spec.params:
        inner = spec.params["inner"]
        if isinstance(inner, bool) or not isinstance(inner, int) or inner < 1:
            raise ValueError(f"params 'inner' must be a positive integer, got {inner!r}")
        if isinstance(spec.dims.get("M"), int) and spec.dims["M"] % inner:
            raise ValueError(f"params 'inner' ({inner}) must divide M ({spec.dims['M']})")
    if set(spec.dims) != {"M", "N"}:
        raise ValueError(f"{spec.family} kernels take dims M (rows) and N (columns); got {sorted(spec.dims)}")
    for name, size in spec.dims.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"dim {name} must be a positive integer, got {size!r}")
    if spec.dtype not in DTYPES:
        raise ValueError(f"dtype {spec.dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    unknown = set(spec.params) - allowed_params
    if unknown:
        raise ValueError(f"{spec.family} does not understand params {sorted(unknown)}; "
                         f"it takes {sorted(allowed_params)}")
    if "epilogue" in spec.params and not epilogue:
        raise ValueError(f"{spec.family} takes no epilogue")
    for key in ("prologue", "epilogue"):
        pointwise.param_chain(spec.params, key)


def number_param(spec: KernelSpec, key: str, default: float, positive: bool = False) -> float:
    value = spec.params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"params {key!r} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"params {key!r} must be positive, got {value!r}")
    return float(value)


# -- tensors ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Operand:
    name: str
    kind: str      # "full": [M, N]; "vector": [N]; "periodic": [period]; "scalar": [1], see pointwise
    step: int      # index of the chain step that reads it
    chain_step: dict  # that step itself (a periodic one says where its operand repeats)


def chain_operands(chain: list[dict], prefix: str = "") -> list[Operand]:
    steps = [i for i, step in enumerate(chain) if pointwise.operand_kind(step)]
    return [Operand(prefix + name, kind, i, chain[i]) for i, (name, kind) in zip(steps, pointwise.operands(chain))]


def _inner(spec: KernelSpec) -> int:
    """> 1: a strided reduction, x's buffer is [M / inner, N, inner]."""
    return int(spec.params.get("inner", 1))


class Rows:
    """The tensors of one row-wise spec and the code pieces its kernel and reference share.

    vectors: the family's own [N] inputs as (name, init), placed between the two chains.
    """

    def __init__(self, spec: KernelSpec, vectors: tuple[tuple[str, str], ...] = ()):
        self.spec = spec
        self.prologue = list(spec.params.get("prologue", []))
        self.epilogue = list(spec.params.get("epilogue", []))
        self.pro_operands = chain_operands(self.prologue)
        self.epi_operands = chain_operands(self.epilogue, "epi_")
        self.vectors = list(vectors)
        self.inner = _inner(spec)

    def inputs(self) -> list[TensorArg]:
        def arg(op: Operand) -> TensorArg:
            return TensorArg(op.name, pointwise.operand_shape(op.chain_step), **pointwise.operand_arg(op.chain_step))
        return ([TensorArg("x", ("M", "N"))] + [arg(o) for o in self.pro_operands]
                + [TensorArg(n, ("N",), init=init) for n, init in self.vectors]
                + [arg(o) for o in self.epi_operands])

    def names(self) -> list[str]:
        return [a.name for a in self.inputs()]

    # -- reference pieces (torch) --
    @staticmethod
    def step_names(operands: list[Operand]) -> dict[int, str]:
        """Chain step index -> operand name, as pointwise.triton_expr / torch_expr take them."""
        return {o.step: o.name for o in operands}

    def ref_prologue(self) -> list[str]:
        """Lines turning `x` into the op's input inside a reference function."""
        return step_lines(self.prologue, "x", self.step_names(self.pro_operands), pointwise.torch_expr)

    def ref_epilogue(self, var: str) -> list[str]:
        return step_lines(self.epilogue, var, self.step_names(self.epi_operands), pointwise.torch_expr)

    def ref_sources(self, op_lines: list[str], scale_lines: list[str], full_out: bool = False,
                    out_view: str = "") -> str:
        """`reference`: prologue, op_lines (leaving the op's output y), epilogue.
        `error_scale`: the same op_lines, then scale_lines (leaving s, the magnitude y's error
        is judged against) carried through the epilogue with pointwise.ERROR_GAIN.
        full_out: the output is x-shaped (softmax); a strided one is returned as the kernel's
        [M, N] view of the [M / Q, N, Q] buffer.  out_view: appended to both results instead (a
        strided norm's [M / Q, N, Q] back to its [M, N] buffer)."""
        rows = out_view or (f".reshape(-1, {self.spec.dims['N']})" if full_out and self.inner > 1 else "")
        reference = self.ref_function("reference", [*op_lines, *self.ref_epilogue("y"), f"return y{rows}"])
        carry = ["x = y"]
        names = self.step_names(self.epi_operands)
        for i, step in enumerate(self.epilogue):
            gain = pointwise.ERROR_GAIN.get(step["op"])
            if gain and pointwise.is_periodic(step) and "{y}" in gain:  # the operand broadcasts over s
                f = gain.format(v=step.get("value"), y="b")
                carry.append(f"s = _periodic(lambda s, b: {f}, s, {names[i]}, {step['every']}, {step['period']})")
            elif pointwise.error_gain(step, names.get(i)):
                carry.append("s = " + pointwise.error_gain(step, names.get(i)))
            carry.append(f"x = {pointwise.torch_expr([step], 'x', {0: names[i]} if i in names else {})}")
        scale = self.ref_function("error_scale", [*op_lines, *scale_lines, *carry, f"return (s + x.abs()){rows}"])
        return self.helpers() + reference + "\n\n" + scale

    def helpers(self) -> str:
        """Source the reference functions need besides torch."""
        return pointwise.reference_helpers(self.prologue + self.epilogue)

    @property
    def red_dim(self) -> int:
        """The dim a reference reduces: the last of [M, N], or the middle of the strided [P, N, Q] view."""
        return 1 if self.inner > 1 else -1

    def regroup(self) -> list[str]:
        """For the strided layout: lines viewing each [M, N] buffer as [M / inner, N, inner]
        (a view, in buffer order: what eager PyTorch would reduce, so the baseline times no
        copy, and what periodic operands index)."""
        if self.inner == 1:
            return []
        n, q = self.spec.dims["N"], self.inner
        lines = []
        for a in self.inputs():
            if len(a.shape) == 2:
                lines.append(f"{a.name} = {a.name}.reshape(-1, {n}, {q})")
            elif a.shape == ("N",):  # an [N] vector runs along the middle dim
                lines.append(f"{a.name} = {a.name}.reshape(-1, 1)")
        return lines

    def ref_function(self, name: str, body: list[str], extra_args: tuple[str, ...] = (),
                     logical: bool = False) -> str:
        """`def name(*extra_args, *inputs)` running the prologue, then `body`; with `logical`,
        a strided x is then turned into the kernel's [M, N] rows (a copy, for judging outputs)."""
        args = ", ".join([*extra_args, *self.names()])
        rows = [f"x = x.transpose(1, 2).reshape(-1, {self.spec.dims['N']})"] if logical and self.inner > 1 else []
        lines = self.regroup() + self.ref_prologue() + rows + body
        return "\n".join([f"def {name}({args}):", *indent(lines)]) + "\n"

    # -- cost --
    def work(self, per_element: float, out: TensorArg) -> tuple[float, float]:
        """(flops, bytes): per_element flops for the op plus one per chain step on every element;
        every input read once and the output written once."""
        dims = self.spec.dims
        steps = len(self.prologue) + len(self.epilogue)
        flops = float(dims["M"] * dims["N"]) * (per_element + steps)
        tensors = [*self.inputs(), out]
        nbytes = sum(math.prod(a.concrete_shape(dims)) * DTYPE_BYTES[a.dtype or self.spec.dtype] for a in tensors)
        return flops, float(nbytes)

    def describe(self, what: str) -> str:
        dims = self.spec.dims
        if self.inner > 1:
            shape = f"{dims['M'] // self.inner}x{dims['N']}x{self.inner}"
            text = f"{what} over the middle dim of a {shape} {self.spec.dtype} tensor"
        else:
            text = f"{what} over the last dim of a {dims['M']}x{dims['N']} {self.spec.dtype} tensor"
        if self.prologue:
            text += f", applied to x after {pointwise.describe_chain(self.prologue)}"
        if self.epilogue:
            text += f", then {pointwise.describe_chain(self.epilogue)} on the result"
        return text


# -- configs --------------------------------------------------------------------------------

def block_sizes(n: int) -> list[int]:
    top = min(max(next_pow2(n), MIN_BLOCK_N), MAX_BLOCK_N)
    return [1 << k for k in range(MIN_BLOCK_N.bit_length() - 1, top.bit_length())]


def config_space(spec: KernelSpec) -> dict[str, list]:
    strided = _inner(spec) > 1
    return {"BLOCK_N": block_sizes(spec.dims["N"]), "num_warps": list(WARPS), "num_stages": list(STAGES),
            "ROWS_PER_PROG": list(INNER_ROWS_PER_PROG if strided else ROWS_PER_PROG),
            "PERSISTENT": [False] if strided else [False, True]}


def warps_for(tile: int) -> int:
    """About 8 elements a thread up to 8 warps; tiles from 8K elements get 16 warps so a
    thread holds at most ~16-32 values of each live tile."""
    if tile >= 8192:
        return 16
    return max(1, min(8, tile // 256))


def default_config(spec: KernelSpec, hw) -> dict:
    """What a human would start with: whole rows in registers when they fit, short rows packed
    several to a program while the grid still fills the GPU, a persistent grid only when there
    are far more row groups than programs the GPU can hold at once."""
    M, N = spec.dims["M"], spec.dims["N"]
    if _inner(spec) > 1:  # neighbouring q as rows (coalesced loads), a short chunk of N as columns
        rows = max([r for r in INNER_ROWS_PER_PROG if r <= min(_inner(spec), 64)], default=INNER_ROWS_PER_PROG[0])
        block = min(max(MIN_BLOCK_N, next_pow2(N)), max(MIN_BLOCK_N, INNER_TILE // rows))
        return {"BLOCK_N": block, "num_warps": warps_for(rows * block), "num_stages": 1 if block >= N else 2,
                "ROWS_PER_PROG": rows, "PERSISTENT": False}
    sms = getattr(hw, "sms", None) or 132
    single = next_pow2(N) <= SINGLE_PASS_LIMIT
    block = max(MIN_BLOCK_N, next_pow2(N)) if single else LOOP_BLOCK_N
    rows = 1
    for r in ROWS_PER_PROG:
        if r * block <= PACKED_TILE and -(-M // r) >= 2 * sms:
            rows = r
    groups = -(-M // rows)
    return {"BLOCK_N": block, "num_warps": warps_for(rows * block), "num_stages": 1 if single else 2,
            "ROWS_PER_PROG": rows, "PERSISTENT": groups > PERSISTENT_WAVES * sms}


def checked_config(spec: KernelSpec, config: dict) -> dict:
    """The config's knobs, each required and legal for this spec (ValueError otherwise)."""
    space = config_space(spec)
    for knob, legal in space.items():
        if knob not in config:
            raise ValueError(f"config lacks {knob}; {spec.family} needs {', '.join(space)}")
        if config[knob] not in legal:
            raise ValueError(f"{knob}={config[knob]!r} is not legal for N={spec.dims['N']}; legal: {legal}")
    return {knob: config[knob] for knob in space}


def check_dims(spec: KernelSpec, config: dict) -> dict[str, int]:
    """Rows: one full row group and a partial one (for a persistent grid, more groups than the
    off-GPU grid has programs, so the grid-stride loop turns); columns: >= 2 chunks plus the
    real tail for looped kernels, the real N for single-pass ones."""
    rows = config["ROWS_PER_PROG"]
    inner = _inner(spec)
    if inner > 1:  # inner and N are baked into the launcher's [-1, N, inner] view: keep them, take two slabs
        return {"M": inner * min(spec.dims["M"] // inner, 2), "N": spec.dims["N"]}
    full_groups = CPU_SMS * PROGRAMS_PER_SM + 1 if config["PERSISTENT"] else 1
    m = max(3, rows * full_groups + max(1, rows // 2))
    return {"M": min(spec.dims["M"], m), "N": small_dim(spec.dims["N"], config["BLOCK_N"])}


class RowFamily(Family):
    """Family methods the three row-wise families share."""

    def layout(self, spec: KernelSpec) -> Rows:
        """The spec's tensors; families with their own [N] inputs (norm weights) override it."""
        return Rows(spec)

    def inputs(self, spec: KernelSpec) -> list[TensorArg]:
        return self.layout(spec).inputs()

    def config_space(self, spec: KernelSpec) -> dict[str, list]:
        return config_space(spec)

    def default_config(self, spec: KernelSpec, hw) -> dict:
        return default_config(spec, hw)

    def check_dims(self, spec: KernelSpec, config: dict) -> dict[str, int]:
        return check_dims(spec, config)


# -- Triton source ----------------------------------------------------------------------------

class RowTemplate:
    """Triton code pieces for one spec and config.  Kernel bodies are lists of lines; the
    family writes the op, this class writes the loads, chains, stores, row loop and launcher."""

    def __init__(self, rows: Rows, config: dict, kernel_name: str, out_rows_only: bool):
        self.rows = rows
        self.config = checked_config(rows.spec, config)
        self.kernel_name = kernel_name
        self.out_rows_only = out_rows_only   # output [M] (reductions) rather than [M, N]
        self.single = self.config["BLOCK_N"] >= rows.spec.dims["N"]
        self.strided = rows.inner > 1

    # -- tile pieces --
    def chunks(self, body: list[str], comment: str = "") -> list[str]:
        """`body` over the row's columns: once when the row is one tile, else a chunk loop."""
        if self.single:
            return ["cols = tl.arange(0, BLOCK_N)", *self._masks(), *body]
        head = CHUNK_LOOP + (f"  # {comment}" if comment else "")
        return [head, *indent(["cols = start + tl.arange(0, BLOCK_N)", *self._masks(), *body])]

    @staticmethod
    def _masks() -> list[str]:
        return ["col_mask = cols < N", "mask = row_mask[:, None] & col_mask[None, :]"]

    def _flat_index(self) -> str:
        """The tile's elements' row-major index in the whole tensor ([M, N], or the strided
        [M / Q, N, Q] buffer)."""
        if self.strided:
            return "base64[:, None] + cols[None, :].to(tl.int64) * Q"
        return "rows64[:, None] * N + cols[None, :]"

    def load_full(self, name: str) -> str:
        where = self._flat_index() if self.strided else f"rows64[:, None] * stride_{name} + cols[None, :]"
        return f"{name} = tl.load({name}_ptr + {where}, mask=mask, other=0.0).to(tl.float32)"

    @staticmethod
    def load_vector(name: str) -> str:
        return f"{name} = tl.load({name}_ptr + cols[None, :], mask=col_mask[None, :], other=0.0).to(tl.float32)"

    def load_periodic(self, o: Operand) -> str:
        """A broadcast operand read in place at each element's row-major index."""
        offs = pointwise.periodic_offsets(o.chain_step, self._flat_index())
        return f"{o.name} = tl.load({o.name}_ptr + {offs}, mask=mask, other=0.0).to(tl.float32)"

    def _load_operands(self, operands: list[Operand]) -> list[str]:
        load = {"full": lambda o: self.load_full(o.name), "vector": lambda o: self.load_vector(o.name),
                "periodic": self.load_periodic, "scalar": lambda o: pointwise.operand_load(o.name, o.chain_step)}
        return [load[o.kind](o) for o in operands]

    def load_x(self, fill: str = "0.0", extra_steps: tuple[dict, ...] = ()) -> list[str]:
        """Load the x tile in fp32, apply the prologue (plus the family's extra_steps), and set
        padding columns to `fill`, the value that cannot change the row's result."""
        chain = self.rows.prologue + list(extra_steps)
        lines = [self.load_full("x"), *self._load_operands(self.rows.pro_operands)]
        lines += step_lines(chain, "x", Rows.step_names(self.rows.pro_operands))
        if chain or fill != "0.0":
            lines.append(f"x = tl.where(col_mask[None, :], x, {fill})  # padding must not change the result")
        return lines

    def epilogue(self, var: str) -> list[str]:
        if not self.rows.epilogue:
            return []
        names = Rows.step_names(self.rows.epi_operands)
        return [*self._load_operands(self.rows.epi_operands), *step_lines(self.rows.epilogue, var, names)]

    def store(self, var: str) -> str:
        if self.out_rows_only:
            return f"tl.store(out_ptr + rows64 * stride_out, {var}.to(out_ptr.dtype.element_ty), mask=row_mask)"
        if self.strided:  # an x-shaped output lies in x's own [M / Q, N, Q] order
            return f"tl.store(out_ptr + {self._flat_index()}, {var}.to(out_ptr.dtype.element_ty), mask=mask)"
        return (f"tl.store(out_ptr + rows64[:, None] * stride_out + cols[None, :], "
                f"{var}.to(out_ptr.dtype.element_ty), mask=mask)")

    # -- whole kernel and module --
    def _full_names(self) -> list[str]:
        return [a.name for a in self.rows.inputs() if len(a.shape) == 2]

    def kernel(self, body: list[str]) -> list[str]:
        ptrs = ", ".join(f"{n}_ptr" for n in self.rows.names()) + ", out_ptr"
        if self.strided:
            strides = "Q, stride_out"
            group = ["qblocks = tl.cdiv(Q, ROWS_PER_PROG)",
                     "p = (group // qblocks).to(tl.int64)  # element offsets can pass 2**31",
                     "q = (group % qblocks) * ROWS_PER_PROG + tl.arange(0, ROWS_PER_PROG)",
                     "row_mask = q < Q",
                     "rows64 = p * Q + q  # row (p, q) of the [M / Q, Q] output",
                     "base64 = p * N * Q + q  # its first element in x's [M / Q, N, Q] buffer",
                     *body]
        else:
            strides = ", ".join(f"stride_{n}" for n in self._full_names()) + ", stride_out"
            group = ["rows = group * ROWS_PER_PROG + tl.arange(0, ROWS_PER_PROG)",
                     "row_mask = rows < M",
                     "rows64 = rows.to(tl.int64)  # element offsets can pass 2**31",
                     *body]
        if self.config["PERSISTENT"]:
            walk = ["first, groups, stride = tl.program_id(0), tl.cdiv(M, ROWS_PER_PROG), tl.num_programs(0)",
                    *interpreter_ints(["first", "groups", "stride"]),
                    "for group in range(first, groups, stride):",
                    *indent(group)]
        else:
            walk = ["group = tl.program_id(0)", *group]
        if not self.single:  # the chunk loops run to N
            walk = [*interpreter_ints(["N"]), *walk]
        return ["@triton.jit",
                f"def {self.kernel_name}({ptrs},",
                f"        M, N, {strides},",
                "        BLOCK_N: tl.constexpr, ROWS_PER_PROG: tl.constexpr):",
                *indent(walk)]

    def loops(self) -> bool:
        """Whether the kernel has a loop with run-time bounds (and so needs INTERPRETED)."""
        return self.config["PERSISTENT"] or not self.single

    def launch(self) -> list[str]:
        c = self.config
        names = self.rows.names()
        strides = ["Q"] if self.strided else [f"{n}.stride(0)" for n in self._full_names()]
        args = ", ".join([*names, "out", "M", "N", *strides, "out.stride(0)"])
        lines = [f"def launch({', '.join(names)}, *, out):", "    M, N = x.shape"]
        if self.single:
            lines.append(f"    assert N <= {c['BLOCK_N']}, 'single-pass kernel: a whole row must fit in one tile'")
        if self.strided:
            lines += [f"    Q = {self.rows.inner}  # x's buffer is [M / Q, N, Q], contiguous",
                      "    assert M % Q == 0 and all(t.is_contiguous() for t in "
                      f"({', '.join(self._full_names() + ([] if self.out_rows_only else ['out']))},)), "
                      "'strided kernel: contiguous [M / Q, N, Q] buffers'",
                      f"    groups = (M // Q) * triton.cdiv(Q, {c['ROWS_PER_PROG']})"]
        else:
            lines.append(f"    groups = triton.cdiv(M, {c['ROWS_PER_PROG']})")
        if c["PERSISTENT"]:
            lines += ["    # persistent: a fixed grid of a few programs per SM walks the row groups",
                      f"    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else {CPU_SMS}",
                      f"    grid = (min(groups, sms * {PROGRAMS_PER_SM}),)"]
        else:
            lines.append("    grid = (groups,)")
        lines += [f"    {self.kernel_name}[grid](",
                  f"        {args},",
                  f"        BLOCK_N={c['BLOCK_N']}, ROWS_PER_PROG={c['ROWS_PER_PROG']},",
                  f"        num_warps={c['num_warps']}, num_stages={c['num_stages']})"]
        return lines

    def module(self, title: str, body: list[str]) -> str:
        c = self.config
        shape = ("single pass: each row is one BLOCK_N tile held in registers" if self.single
                 else "looped: each row is walked in BLOCK_N column chunks")
        if self.strided:
            shape += f"; rows are neighbouring q of x's [M / {self.rows.inner}, N, {self.rows.inner}] buffer"
        header = [f"# MTMC kernel: {title}",
                  f"# config: BLOCK_N={c['BLOCK_N']} ROWS_PER_PROG={c['ROWS_PER_PROG']} num_warps={c['num_warps']} "
                  f"num_stages={c['num_stages']} PERSISTENT={c['PERSISTENT']}",
                  f"# {shape}" + ("; a persistent grid walks the row groups" if c["PERSISTENT"] else "")]
        imports = [*(["import os"] if self.loops() else []),
                   "import torch", "import triton", "import triton.language as tl"]
        interpreted = [INTERPRETED_SOURCE.strip("\n"), "", ""] if self.loops() else []
        return "\n".join([*header, *imports, "", "", *interpreted, *self.kernel(body), "", "",
                          *self.launch()]) + "\n"
