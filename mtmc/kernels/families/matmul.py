"""Matmul and batched matmul with a fused pointwise epilogue.

a is [M, K] ([B, M, K] for bmm); b is [K, N] ([B, K, N]), or [N, K] ([B, N, K]) when
params["b_layout"] == "nk" (the nn.Linear weight layout, read transposed through its strides).
params["epilogue"] is a pointwise chain applied to the fp32 accumulator before the store; its
operands follow a and b in pointwise.operands() order: "bias" ones are [N], "full" ones are
[M, N] ([B, M, N]), one-value ("scalar") ones [1], loaded once.  The output is [M, N]
([B, M, N]) in the spec's dtype.  params["allow_tf32"] (float32 only): the user accepts TF32
products (one per fp32 product, 10-bit mantissa; the tolerance widens to match), otherwise fp32
accuracy (IEEE FMAs or three TF32 products per product).

Knobs: tile sizes, a grouped tile order for L2 reuse (GROUP_M), split-K (partial fp32 tiles in
a workspace, summed by a second kernel that applies the epilogue), a persistent grid, warps and
pipeline stages.  One "work item" is (batch, K split, tile); the grid runs one per program, or a
persistent grid of one program per SM strides over them.
"""
from __future__ import annotations

from mtmc.kernels import pointwise
from mtmc.kernels.families.elementwise import (
    IMPORTS, INTERPRETED_SOURCE, SM_COUNT_SOURCE, chain_lines, config_line, flat_kernel_source, indent,
    interpreter_ints, operand_loads, operand_steps, signature, step_lines,
)
from mtmc.kernels.family import CPU_SMS, DTYPE_BYTES, Family, TensorArg, elements, small_dim
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import TF32_ERROR_SCALE, KernelSpec

REDUCE_BLOCK = 1024    # elements per program of the split-K reduction
FP32_PRECISIONS = ("ieee", "tf32x3")

GROUPED_TILE_SOURCE = '''
@triton.jit
def grouped_tile(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile index -> (pid_m, pid_n), walking GROUP_M rows of tiles column by column so that
    programs running at the same time reuse the same panels of a and b from L2."""
    tiles_m = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    group_size = GROUP_M * tiles_n
    first_m = (tile // group_size) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group_size) % rows
    pid_n = (tile % group_size) // rows
    return pid_m, pid_n
'''

# Triton's interpreter multiplies the bit patterns of bf16 tiles in tl.dot (triton#11584), so
# there, and only there, bf16 tiles are upcast first (exact: a bf16 product fits in fp32).
BF16_UPCAST = """
        if INTERPRETED:  # see triton#11584
            a, b = a.to(tl.float32), b.to(tl.float32)"""

DOT_TILE_SOURCE = '''
@triton.jit
def dot_tile(a_ptr, b_ptr, off_m, off_n, k_lo, k_hi, M, N, stride_am, stride_ak, stride_bk, stride_bn,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 sum over k in [k_lo, k_hi) of a[off_m + i, k] * b[k, off_n + j] for one tile."""
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mask_m = off_m + rm < M
    mask_n = off_n + rn < N
    # the tile's corner in 64-bit (big tensors pass 2**31 elements), offsets inside it in 32-bit
    a_ptrs = a_ptr + (off_m.to(tl.int64) * stride_am + k_lo.to(tl.int64) * stride_ak)
    a_ptrs += rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + (k_lo.to(tl.int64) * stride_bk + off_n.to(tl.int64) * stride_bn)
    b_ptrs += rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{interpreter_ints}
    for k in range(k_lo, k_hi, BLOCK_K):
        mask_k = k + rk < k_hi
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0){upcast}
        acc = {dot}
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc
'''


class MatmulFamily(Family):
    name = "matmul"
    ops = FAMILY_OPS["matmul"]

    # -- what ------------------------------------------------------------------------------
    def epilogue(self, spec: KernelSpec) -> list[dict]:
        return list(spec.params.get("epilogue") or [])

    def b_nk(self, spec: KernelSpec) -> bool:
        return spec.params.get("b_layout", "kn") == "nk"

    def batch(self, spec: KernelSpec) -> tuple[str, ...]:
        return ("B",) if spec.op == "bmm" else ()

    def describe(self, spec: KernelSpec) -> str:
        d = spec.dims
        what = f"batched matmul of {d['B']} pairs" if spec.op == "bmm" else "matmul"
        b = "[N, K] (nn.Linear weight layout)" if self.b_nk(spec) else "[K, N]"
        epi = self.epilogue(spec)
        then = f", then {pointwise.describe_chain(epi)} on the result" if epi else ""
        tf32 = " (TF32 products allowed)" if spec.params.get("allow_tf32") else ""
        return (f"{what}: [{d['M']} x {d['K']}] times [{d['K']} x {d['N']}] in {spec.dtype}{tf32}, "
                f"b stored as {b}{then}")

    def validate(self, spec: KernelSpec) -> None:
        super().validate(spec)
        for d in ("M", "N", "K", *self.batch(spec)):
            if int(spec.dims.get(d, 0)) < 1:
                raise ValueError(f"{spec.op} needs a positive dim {d}; got dims {spec.dims}")
        if spec.params.get("b_layout", "kn") not in ("kn", "nk"):
            raise ValueError("b_layout must be 'kn' (b is [K, N]) or 'nk' (b is [N, K], the nn.Linear weight)")
        if spec.params.get("allow_tf32") not in (None, False, True) or (spec.params.get("allow_tf32")
                                                                       and spec.dtype != "float32"):
            raise ValueError("allow_tf32 (true or false) is for float32 matmuls")
        epi = spec.params.get("epilogue", [])
        if not isinstance(epi, list):
            raise ValueError("the matmul epilogue must be a list of pointwise steps")
        pointwise.validate_chain(epi, indexed=True)   # the tile knows each element's row and column
        if pointwise.uses_periodic(epi):
            raise ValueError("matmul epilogues take full or [N] operands, not broadcast (periodic) ones")

    def inputs(self, spec: KernelSpec) -> list[TensorArg]:
        bt = self.batch(spec)
        args = [TensorArg("a", (*bt, "M", "K")),
                TensorArg("b", (*bt, "N", "K") if self.b_nk(spec) else (*bt, "K", "N"))]
        epi = self.epilogue(spec)
        for i, name, _ in operand_steps(epi):
            shape = pointwise.operand_shape(epi[i], full=(*bt, "M", "N"))
            args.append(TensorArg(name, shape, **pointwise.operand_arg(epi[i])))
        return args

    def output(self, spec: KernelSpec) -> TensorArg:
        return TensorArg("out", (*self.batch(spec), "M", "N"))

    def reference_source(self, spec: KernelSpec) -> str:
        epi = self.epilogue(spec)
        names = {i: name for i, name, _ in operand_steps(epi)}
        b = "b.transpose(-1, -2)" if self.b_nk(spec) else "b"
        args = [a.name for a in self.inputs(spec)]
        reference = [signature("reference", args), f"    x = torch.matmul(a, {b})",
                     *indent(step_lines(epi, "x", names, pointwise.torch_expr)), "    return x"]
        # The error of a K-long fp32 sum scales with sum |a||b|; each step then scales it by its
        # local slope; |out| covers the final rounding to the output dtype.
        scale = [signature("error_scale", args), f"    x = torch.matmul(a, {b})",
                 f"    s = torch.matmul(a.abs(), {b}.abs())"]
        for i, (step, line) in enumerate(zip(epi, step_lines(epi, "x", names, pointwise.torch_expr))):
            gain = pointwise.error_gain(step, names.get(i))
            if gain:
                scale.append("    s = " + gain)
            scale.append("    " + line)
        factor = f" * {TF32_ERROR_SCALE}" if spec.params.get("allow_tf32") else ""
        scale.append(f"    return (s + x.abs()){factor}")
        return "\n".join(reference) + "\n\n\n" + "\n".join(scale) + "\n"

    # -- how -------------------------------------------------------------------------------
    def config_space(self, spec: KernelSpec) -> dict[str, list]:
        space = {"BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256],
                 "BLOCK_K": [16, 32, 64, 128], "GROUP_M": [1, 2, 4, 8, 16], "SPLIT_K": [1, 2, 4, 8, 16],
                 "PERSISTENT": [False, True], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4, 5, 6]}
        if pointwise.uses_index(self.epilogue(spec)):
            space["SPLIT_K"] = [1]   # tril/triu need the tile's rows and columns: no flat split-K epilogue
        if spec.dtype == "float32":
            # fp32 accuracy either way: IEEE FMAs, or three TF32 tensor-core products (sm_80+)
            space["PRECISION"] = list(FP32_PRECISIONS) + (["tf32"] if spec.params.get("allow_tf32") else [])
        return space

    def default_config(self, spec: KernelSpec, hw) -> dict:
        d = spec.dims
        m, n, k, batch = d["M"], d["N"], d["K"], d.get("B", 1) if spec.op == "bmm" else 1

        def tile(size: int) -> int:  # 128, or the smallest power of two covering a small dim
            return max(16, min(128, 1 << max(size - 1, 1).bit_length()))

        bm, bn = tile(m), tile(n)
        # fp32 tiles are twice as wide in shared memory: half the K depth keeps the same smem per stage.
        bk = 32 if spec.dtype == "float32" else 64
        bk = min(bk, max(16, 1 << max(k - 1, 1).bit_length()))
        tiles = batch * -(-m // bm) * -(-n // bn)
        # Few tiles but a long K: split K until about one program per SM, keeping >= 4 chunks each.
        sms = getattr(hw, "sms", 132)
        split = 1
        while (split < 16 and tiles * split * 2 <= sms and k >= split * 2 * 4 * bk
               and not pointwise.uses_index(self.epilogue(spec))):
            split *= 2
        # Warps: 4 drive a 128x128 tensor-core tile; the fp32 FMA path wants 8 there (64
        # accumulators a thread; measured on an H200 at 4096^3: 44 vs 33 TFLOP/s).
        # fp32 on tensor cores (tf32x3) where the GPU has TF32: cuBLAS's fp32 GEMM runs FMAs at
        # ~52 TFLOP/s on an H200 and an IEEE Triton tile does not reach it.
        tf32x3 = spec.dtype == "float32" and "tf32" in getattr(hw, "tc_tflops", {})
        # tf32x3 splits each fp32 tile into two TF32 halves: 8 warps there too (4 spill at 128x128)
        big = 128 * 128 if spec.dtype == "float32" else 128 * 256
        config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8 if -(-m // bm) > 1 else 1,
                  "SPLIT_K": split, "PERSISTENT": False, "num_warps": 8 if bm * bn >= big else 4,
                  "num_stages": 3}
        if spec.dtype == "float32":
            # one TF32 product where the user allowed it (a third of tf32x3's tensor work)
            config["PRECISION"] = ("tf32" if spec.params.get("allow_tf32") else "tf32x3") if tf32x3 else "ieee"
        return config

    def render(self, spec: KernelSpec, config: dict) -> str:
        # a config from before the precision knob (memory, a user's file) meant IEEE products
        space = self.config_space(spec)
        cfg = {**({"PRECISION": "ieee"} if "PRECISION" in space else {}), **{k: config[k] for k in space if k in config}}
        epi = self.epilogue(spec)
        split = int(cfg["SPLIT_K"])
        dot = (f'tl.dot(a, b, acc=acc, input_precision="{cfg["PRECISION"]}")  '
               + ("# TF32 products: allowed by the spec" if cfg["PRECISION"] == "tf32" else "# fp32 accuracy")
               if spec.dtype == "float32" else "tl.dot(a, b, acc=acc)  # fp32 accumulation")
        bf16 = spec.dtype == "bfloat16"
        dot_tile = (DOT_TILE_SOURCE.replace("{dot}", dot).replace("{upcast}", BF16_UPCAST if bf16 else "")
                    .replace("{interpreter_ints}", "\n".join(indent(interpreter_ints(["k_lo", "k_hi"])))))
        blocks = [INTERPRETED_SOURCE, GROUPED_TILE_SOURCE, dot_tile, self._kernel(epi, cfg)]
        if split > 1:
            blocks.append(self._reduce_kernel(epi))
        blocks += [SM_COUNT_SOURCE, self._launch(spec, cfg)]
        return (self._header(spec, cfg) + "import os\n" + IMPORTS + "\n\n"
                + "\n\n\n".join(b.strip("\n") for b in blocks) + "\n")

    def _header(self, spec: KernelSpec, cfg: dict) -> str:
        bt = "[B, ...] " if spec.op == "bmm" else ""
        b = "b[N, K] read transposed" if self.b_nk(spec) else "b[K, N]"
        epi = pointwise.describe_chain(self.epilogue(spec))
        return (f"# {spec.op}: out {bt}[M, N] = a[M, K] @ {b}, then {epi}; {spec.dtype}\n"
                f"# config: {config_line(cfg)}\n")

    def _kernel(self, epi: list[dict], cfg: dict) -> str:
        split = int(cfg["SPLIT_K"]) > 1
        dead = pointwise.zeroed_tile(epi, ("off_m", "off_m + BLOCK_M - 1"), ("off_n", "off_n + BLOCK_N - 1"))
        operands = [] if split else [f"{name}_ptr" for _, name, _ in operand_steps(epi)]
        params = ["a_ptr", "b_ptr", *operands, "partials_ptr" if split else "out_ptr", "M", "N", "K", "B",
                  "stride_ab", "stride_am", "stride_ak", "stride_bb", "stride_bk", "stride_bn",
                  *(f"{c}: tl.constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K"))]
        body = [
            "# work item w -> (batch, K split, tile); tiles vary fastest so programs that run",
            "# together share panels of a and b",
            "tile = w % tiles",
            "split = (w // tiles) % SPLIT_K",
            "bid = (w // tiles // SPLIT_K).to(tl.int64)",
            "pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)",
            "off_m = pid_m * BLOCK_M",
            "off_n = pid_n * BLOCK_N",
            "# each split sums its own run of whole BLOCK_K chunks",
            "k_chunk = (K + SPLIT_K * BLOCK_K - 1) // (SPLIT_K * BLOCK_K) * BLOCK_K",
            "k_lo = split * k_chunk",
            "k_hi = tl.minimum(k_lo + k_chunk, K)",
            *(["# a tile the tril / triu step zeroes whole skips its products (tl.where discards them)",
               f"k_hi = tl.where({dead}, k_lo, k_hi)"] if dead else []),
            "acc = dot_tile(a_ptr + bid * stride_ab, b_ptr + bid * stride_bb, off_m, off_n, k_lo,",
            "               k_hi, M, N, stride_am, stride_ak, stride_bk, stride_bn,",
            "               BLOCK_M, BLOCK_N, BLOCK_K)",
            "rm = tl.arange(0, BLOCK_M)",
            "rn = tl.arange(0, BLOCK_N)",
            "mask_n = off_n + rn < N",
            "mask = (off_m + rm < M)[:, None] & mask_n[None, :]",
            "local = rm[:, None] * N + rn[None, :]  # offsets inside a contiguous [M, N] tile",
        ]
        if split:
            body += ["# fp32 partial tile; the reduction kernel sums the splits and applies the epilogue",
                     "tile_off = ((split * B + bid) * M + off_m) * N + off_n",
                     "tl.store(partials_ptr + tile_off + local, acc, mask=mask)"]
        else:
            loads = operand_loads(epi, "tile_off + local", "off_n + rn[None, :]", "mask", "mask_n[None, :]")
            body += ["tile_off = (bid * M + off_m) * N + off_n",
                     *(["# epilogue on the fp32 tile"] if epi else []),
                     *(["row_idx = off_m + rm[:, None]  # each element's row and column (tril/triu)",
                        "col_idx = off_n + rn[None, :]"] if pointwise.uses_index(epi) else []),
                     "x = acc", *chain_lines(epi, loads),
                     "tl.store(out_ptr + tile_off + local, x.to(out_ptr.dtype.element_ty), mask=mask)"]
        if cfg["PERSISTENT"]:
            head = ["# persistent: one program per SM strides over the work items",
                    "first, work, stride = tl.program_id(0), B * SPLIT_K * tiles, tl.num_programs(0)",
                    *interpreter_ints(["first", "work", "stride"]),
                    "for w in range(first, work, stride):"]
            body = [*head, *indent(body)]
        else:
            body = ["w = tl.program_id(0)", *body]
        body = ["# sizes in inline arithmetic, not tl.cdiv: each jit call costs the interpreter dearly",
                "tiles = ((M + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)", *body]
        return "@triton.jit\n" + signature("matmul_kernel", params) + "\n" + "\n".join(indent(body)) + "\n"

    def _reduce_kernel(self, epi: list[dict]) -> str:
        x_lines = ["part = partials_ptr + offs  # split 0; each next split lies numel further on",
                   "x = tl.load(part, mask=mask)",
                   "for s in tl.static_range(1, SPLIT_K):",
                   "    part += numel",
                   "    x += tl.load(part, mask=mask)"]
        return flat_kernel_source("splitk_reduce_kernel", epi, ["partials_ptr"], x_lines, False, ("SPLIT_K",))

    def _launch(self, spec: KernelSpec, cfg: dict) -> str:
        names = [a.name for a in self.inputs(spec)]
        operands = names[2:]
        split = int(cfg["SPLIT_K"])
        lines = []
        if operands:
            lines.append(f"{', '.join(operands)} = {', '.join(f'{n}.contiguous()' for n in operands)}"
                         "  # indexed like out")
        lines += ['assert out.is_contiguous(), "out must be contiguous"',
                  "M, K = a.shape[-2:]",
                  "N = b.shape[-2]  # b is [N, K]: read transposed through its strides"
                  if self.b_nk(spec) else "N = b.shape[-1]",
                  "B = a.shape[0] if a.dim() == 3 else 1",
                  "stride_ab = a.stride(0) if a.dim() == 3 else 0",
                  "stride_bb = b.stride(0) if b.dim() == 3 else 0",
                  "stride_bk, stride_bn = b.stride(-1), b.stride(-2)" if self.b_nk(spec)
                  else "stride_bk, stride_bn = b.stride(-2), b.stride(-1)",
                  f"BLOCK_M, BLOCK_N, SPLIT_K = {cfg['BLOCK_M']}, {cfg['BLOCK_N']}, {split}",
                  "work = B * SPLIT_K * triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)",
                  "if work == 0:",
                  "    return",
                  "grid = (min(work, sm_count(a)),)  # persistent" if cfg["PERSISTENT"] else "grid = (work,)"]
        if split > 1:
            lines.append("partials = torch.empty((SPLIT_K, B, M, N), device=out.device, dtype=torch.float32)")
        lines += [f"matmul_kernel[grid](a, b, {'partials' if split > 1 else ', '.join([*operands, 'out'])}, "
                  "M, N, K, B, stride_ab, a.stride(-2), a.stride(-1),",
                  "                    stride_bb, stride_bk, stride_bn, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,",
                  f"                    BLOCK_K={cfg['BLOCK_K']}, GROUP_M={cfg['GROUP_M']}, SPLIT_K=SPLIT_K,",
                  f"                    num_warps={cfg['num_warps']}, num_stages={cfg['num_stages']})"]
        if split > 1:
            lines += ["numel = B * M * N",
                      f"splitk_reduce_kernel[(triton.cdiv(numel, {REDUCE_BLOCK}),)](",
                      f"    partials, {', '.join([*operands, 'out'])}, numel, N, BLOCK={REDUCE_BLOCK},",
                      f"    INDEX_64=numel + {REDUCE_BLOCK} > 2**31, SPLIT_K=SPLIT_K, num_warps=4)"]
        return signature("launch", [*names, "*", "out"]) + "\n" + "\n".join(indent(lines)) + "\n"

    # -- cost and checking -----------------------------------------------------------------
    def work(self, spec: KernelSpec) -> tuple[float, float]:
        d = spec.dims
        batch = d["B"] if spec.op == "bmm" else 1
        m, n, k = d["M"], d["N"], d["K"]
        epi = self.epilogue(spec)
        elems = batch * (m * k + k * n + m * n) + elements(self.inputs(spec)[2:], d)
        # tiles a tril / triu zeroes whole are skipped: their products are not work
        flops = batch * m * n * (2 * k * pointwise.kept_share(epi, m, n) + len(epi))
        return float(flops), float(elems * DTYPE_BYTES[spec.dtype])

    def check_dims(self, spec: KernelSpec, config: dict) -> dict[str, int]:
        # Rows of tiles: one more than a group (to cross a group boundary into a partial group),
        # and for a persistent grid more work items than the CPU grid has programs.
        rows = int(config["GROUP_M"]) + 1
        if config.get("PERSISTENT"):
            rows = max(rows, CPU_SMS)
        d = spec.dims
        dims = {"M": small_dim(d["M"], int(config["BLOCK_M"]), rows),
                "N": small_dim(d["N"], int(config["BLOCK_N"])),
                "K": small_dim(d["K"], int(config["BLOCK_K"]) * int(config["SPLIT_K"]))}
        if spec.op == "bmm":
            dims["B"] = min(d["B"], 3)
        return dims


FAMILY = MatmulFamily()
