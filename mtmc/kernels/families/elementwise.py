"""Elementwise chains: out = chain(x) over an [M, N] tensor, one flat BLOCK of elements per program.

The chain is a list of pointwise steps (mtmc.kernels.pointwise).  Its operands follow x in the
input list in pointwise.operands() order: "full" operands are [M, N], "bias" operands are [N] and
broadcast over the rows, periodic ones are read in place, one-value ("scalar") ones loaded once.
Everything is computed in fp32 and stored in the spec's dtype.

The render helpers here (operand loads, the flat kernel, the SM count) also build matmul's
split-K reduction, so a chain is loaded and applied the same way wherever it appears.
"""
from __future__ import annotations

import math


from mtmc.kernels import pointwise
from mtmc.kernels.family import CPU_SMS, DTYPE_BYTES, PROGRAMS_PER_SM, Family, TensorArg, small_dim
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import KernelSpec

SM_COUNT_SOURCE = f'''
def sm_count(t):
    """SMs of t's GPU; off-GPU (the interpreter) a small stand-in so persistent grids still loop."""
    if t.is_cuda:
        return torch.cuda.get_device_properties(t.device).multi_processor_count
    return {CPU_SMS}
'''

IMPORTS = "import torch\nimport triton\nimport triton.language as tl\n"

# Loops with run-time bounds.  Triton 3.6's interpreter turns a range() bound into an int with
# int() on a 1-element numpy array, which NumPy >= 2.4 refuses ("only 0-dimensional arrays can be
# converted to Python scalars", triton#9171; later interpreters squeeze the array first).  So under
# the interpreter, and only there, the kernels make their loop bounds Python ints before the loop.
# INTERPRETED is a constexpr: on a GPU it is False, the branch is never compiled, and the loop is
# the same scf.for over the same values.  Kernels using it need `import os` and INTERPRETED_SOURCE.
INTERPRETED_SOURCE = '''
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")  # Triton's CPU interpreter
'''


def interpreter_ints(names: list[str]) -> list[str]:
    """Lines that, in Triton's interpreter only, rebind the scalar tensors `names` to Python ints
    so that range() takes them (see INTERPRETED_SOURCE).  Always a tuple unpacking: the
    interpreter rewrites a plain `n = value` into `n = to_tensor(value)`, making the int a tensor
    again, and passes a tuple through as it is."""
    single = len(names) == 1
    targets = ", ".join(names) + ("," if single else "")
    values = ", ".join(f"{n}.handle.data.item()" for n in names) + ("," if single else "")
    return ["if INTERPRETED:  # Python-int range() bounds for triton 3.6 + NumPy >= 2.4 (triton#9171)",
            f"    {targets} = {values}" + ("  # unpacked, or the interpreter makes it a tensor again"
                                          if single else "")]


# -- render helpers shared with the matmul family -----------------------------------------
def indent(lines: list[str], depth: int = 1) -> list[str]:
    return [("    " * depth + line) if line else line for line in lines]


def signature(name: str, params: list[str], width: int = 100) -> str:
    """`def name(params):` wrapped under the opening parenthesis, for readable generated code."""
    head = f"def {name}("
    lines, line = [], head
    for i, p in enumerate(params):
        piece = p + (", " if i < len(params) - 1 else "):")
        if len(line) + len(piece) > width and line.strip() != head.strip():
            lines.append(line.rstrip())
            line = " " * len(head)
        line += piece
    lines.append(line)
    return "\n".join(lines)


def operand_steps(chain: list[dict]) -> list[tuple[int, str, str]]:
    """(step index, input name, kind) for each step that reads an operand, in input order."""
    steps = [i for i, step in enumerate(chain) if pointwise.operand_kind(step)]
    return [(i, name, kind) for i, (name, kind) in zip(steps, pointwise.operands(chain))]


def operand_loads(chain: list[dict], full_offs: str, vector_offs: str, full_mask: str,
                  vector_mask: str) -> tuple[list[str], dict[int, str]]:
    """Lines loading every operand as fp32, and the step -> variable map triton_expr wants."""
    lines, names = [], {}
    for i, name, kind in operand_steps(chain):
        offs, mask = (full_offs, full_mask) if kind == "full" else (vector_offs, vector_mask)
        if kind == "periodic":  # a broadcast operand read in place
            offs, mask = pointwise.periodic_offsets(chain[i], full_offs), full_mask
        lines.append(pointwise.operand_load(name, chain[i], offs, mask, other=None))
        names[i] = name
    return lines, names


def step_lines(chain: list[dict], x: str, names: dict[int, str], expr=pointwise.triton_expr) -> list[str]:
    """One `x = step(x)` line per chain step (a single nested expression would repeat x for
    steps like gelu that use it twice, and grow exponentially along the chain)."""
    return [f"{x} = {expr([step], x, {0: names[i]} if i in names else {})}" for i, step in enumerate(chain)]


def chain_lines(chain: list[dict], loads: tuple[list[str], dict[int, str]]) -> list[str]:
    """Operand loads, then the chain applied in place to the fp32 value `x`."""
    lines, names = loads
    return [*lines, *step_lines(chain, "x", names)]


def flat_kernel_source(kernel: str, chain: list[dict], x_params: list[str], x_lines: list[str],
                       persistent: bool, constexprs: tuple[str, ...] = ()) -> str:
    """A kernel over `numel` flat elements, BLOCK per program: x_lines compute fp32 `x` at
    `offs` (under `mask`), the chain is applied to it and it is stored to out_ptr + offs."""
    ops = operand_steps(chain)
    params = [*x_params, *(f"{name}_ptr" for _, name, _ in ops), "out_ptr", "numel", "N",
              "BLOCK: tl.constexpr", "INDEX_64: tl.constexpr", *(f"{c}: tl.constexpr" for c in constexprs)]
    body = [
        "if INDEX_64:  # offsets reach 2**31: 32-bit ones would wrap",
        "    start = block.to(tl.int64) * BLOCK",
        "else:",
        "    start = block * BLOCK",
        "offs = start + tl.arange(0, BLOCK)",
        "mask = offs < numel",
    ]
    if any(kind == "vector" for _, _, kind in ops):
        body.append("col = offs % N  # bias operands run along the last dim")
    body += x_lines
    body += chain_lines(chain, operand_loads(chain, "offs", "col", "mask", "mask"))
    body.append("tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=mask)")
    if persistent:
        body = ["# persistent: a fixed grid strides over all the blocks",
                "first, blocks, stride = tl.program_id(0), (numel + BLOCK - 1) // BLOCK, tl.num_programs(0)",
                *interpreter_ints(["first", "blocks", "stride"]),
                "for block in range(first, blocks, stride):",
                *indent(body)]
    else:
        body = ["block = tl.program_id(0)", *body]
    return "@triton.jit\n" + signature(kernel, params) + "\n" + "\n".join(indent(body)) + "\n"


def config_line(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


# -- the family ----------------------------------------------------------------------------
class ElementwiseFamily(Family):
    name = "elementwise"
    ops = FAMILY_OPS["elementwise"]

    def chain(self, spec: KernelSpec) -> list[dict]:
        return list(spec.params.get("chain") or [])

    def describe(self, spec: KernelSpec) -> str:
        chain = self.chain(spec)
        ops = operand_steps(chain)
        extra = f", reading {len(ops)} more tensor{'s' if len(ops) > 1 else ''}" if ops else ""
        return (f"elementwise {pointwise.describe_chain(chain)} over a {spec.dims['M']} x "
                f"{spec.dims['N']} {spec.dtype} tensor{extra}")

    def validate(self, spec: KernelSpec) -> None:
        super().validate(spec)
        for d in ("M", "N"):
            if int(spec.dims.get(d, 0)) < 1:
                raise ValueError(f"elementwise needs a positive dim {d} (x is [M, N]); got dims {spec.dims}")
        chain = spec.params.get("chain")
        if not isinstance(chain, list) or not chain:
            raise ValueError("an elementwise kernel needs a non-empty 'chain' of pointwise steps, "
                             "e.g. [{'op': 'gelu'}]")
        pointwise.validate_chain(chain)

    def inputs(self, spec: KernelSpec) -> list[TensorArg]:
        chain = self.chain(spec)
        return [TensorArg("x", ("M", "N")),
                *(TensorArg(name, pointwise.operand_shape(chain[i]), **pointwise.operand_arg(chain[i])) for i, name, _ in operand_steps(chain))]

    def output(self, spec: KernelSpec) -> TensorArg:
        return TensorArg("out", ("M", "N"))

    def reference_source(self, spec: KernelSpec) -> str:
        chain = self.chain(spec)
        names = {i: name for i, name, _ in operand_steps(chain)}
        body = step_lines(chain, "x", names, pointwise.torch_expr)
        return pointwise.reference_helpers(chain) + "\n".join(
            [signature("reference", [a.name for a in self.inputs(spec)]), *indent(body), "    return x", ""])

    # -- how -------------------------------------------------------------------------------
    def config_space(self, spec: KernelSpec) -> dict[str, list]:
        return {"BLOCK": [2 ** p for p in range(8, 15)], "num_warps": [1, 2, 4, 8, 16],
                "PERSISTENT": [False, True]}

    def default_config(self, spec: KernelSpec, hw) -> dict:
        # Two 16-byte vectors per thread and 4 warps: enough bytes in flight to keep HBM busy
        # without long register lifetimes; small tensors get one block rounded up to a power of 2.
        elems = 2 * (16 // DTYPE_BYTES[spec.dtype]) * 32 * 4
        numel = spec.dims["M"] * spec.dims["N"]
        block = max(256, min(elems, 1 << max(numel - 1, 1).bit_length()))
        return {"BLOCK": block, "num_warps": 4, "PERSISTENT": False}

    def render(self, spec: KernelSpec, config: dict) -> str:
        chain = self.chain(spec)
        block, warps, persistent = int(config["BLOCK"]), int(config["num_warps"]), bool(config["PERSISTENT"])
        kernel = flat_kernel_source(
            "elementwise_kernel", chain, ["x_ptr"],
            ["x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)"], persistent)
        names = [a.name for a in self.inputs(spec)]
        grid = (f"(min(blocks, sm_count(x) * {PROGRAMS_PER_SM}),)  # persistent: the rest by striding"
                if persistent else "(blocks,)")
        launch = [
            f"{', '.join(names)} = {', '.join(f'{n}.contiguous()' for n in names)}  # flat indexing",
            'assert out.is_contiguous(), "out must be contiguous"',
            f"BLOCK = {block}",
            "numel, N = x.numel(), x.shape[-1]",
            "blocks = triton.cdiv(numel, BLOCK)",
            "if blocks == 0:",
            "    return",
            f"grid = {grid}",
            f"elementwise_kernel[grid]({', '.join(names)}, out, numel, N, BLOCK=BLOCK,",
            f"                         INDEX_64=numel + BLOCK > 2**31, num_warps={warps})",
        ]
        header = (f"# elementwise chain over x [M, N] {spec.dtype}: {pointwise.describe_chain(chain)}\n"
                  f"# config: {config_line(config)}\n")
        interpreted = INTERPRETED_SOURCE.strip("\n") + "\n\n\n" if persistent else ""
        return (header + ("import os\n" if persistent else "") + IMPORTS + "\n\n" + interpreted
                + kernel + "\n" + SM_COUNT_SOURCE + "\n\n"
                + signature("launch", [*names, "*", "out"]) + "\n" + "\n".join(indent(launch)) + "\n")

    # -- cost and checking -----------------------------------------------------------------
    def work(self, spec: KernelSpec) -> tuple[float, float]:
        m, n = spec.dims["M"], spec.dims["N"]
        operands = self.inputs(spec)[1:]
        moved = 2 * m * n * DTYPE_BYTES[spec.dtype] + sum(
            math.prod(a.concrete_shape(spec.dims)) * DTYPE_BYTES[a.dtype or spec.dtype] for a in operands)
        return float(m * n * max(1, len(self.chain(spec)))), float(moved)

    def check_dims(self, spec: KernelSpec, config: dict) -> dict[str, int]:
        # Rows keep N's remainder mod 256 (and so its alignment); enough rows for a few blocks and
        # a ragged tail, and for a persistent grid more blocks than the CPU grid has programs.
        block = int(config["BLOCK"])
        blocks = CPU_SMS * PROGRAMS_PER_SM + 2 if config.get("PERSISTENT") else 2
        n = small_dim(spec.dims["N"], 256)
        m = min(spec.dims["M"], -(-blocks * block // n) + 1)
        return {"M": m, "N": n}


FAMILY = ElementwiseFamily()
