"""The conv family's Triton source: one kernel (its K walk chosen by ALGO), an optional split-K
reduction, and launch().

The geometry (kernel size, stride, padding, dilation, groups) is baked into the source as
literals, so the compiler folds it; sizes and strides are read from the tensors at launch, so
one source serves the real shape on a GPU and small shapes in the interpreter.  Only the
spatial dims the op has are generated (conv1d: l; conv2d: h, w; conv3d: d, h, w).

Split-K writes fp32 partial tiles to a workspace that a second kernel sums before applying the
epilogue (as matmul does), rather than fp32 atomics into the output: the result does not depend
on the order the splits finish (atomics make every run round differently), the epilogue's
nonlinear steps see the whole sum, and the output needs no zeroing pass first.  Split-K is only
chosen for small outputs, where the workspace costs little.
"""
from __future__ import annotations

import math

from mtmc.kernels import pointwise
from mtmc.kernels.families._conv_geometry import SPATIAL, is_channel_step, is_transposed, out_names, rank
from mtmc.kernels.families.elementwise import (
    IMPORTS, INTERPRETED_SOURCE, config_line, indent, interpreter_ints, operand_steps, signature, step_lines,
)
from mtmc.kernels.families.matmul import GROUPED_TILE_SOURCE
from mtmc.kernels.spec import KernelSpec

REDUCE_BLOCK = 1024    # elements per program of the split-K reduction


class _Dim:
    """One spatial dim's names and geometry, and the expressions the kernel uses for it."""

    def __init__(self, name: str, k: int, s: int, lo: int, hi: int, dil: int, transposed: bool,
                 mode: str = "zeros"):
        self.v = name.lower()                # l / d / h / w
        self.size, self.out, self.q = name, "O" + name, "Q" + name
        self.k, self.s, self.lo, self.hi, self.dil, self.t, self.mode = k, s, lo, hi, dil, transposed, mode
        self.phased = transposed and s > 1   # several stride phases: only some taps reach a phase
        self.step = s // math.gcd(s, dil) if self.phased else 1    # valid taps repeat with this period
        self.bound = min(self.step, k)
        self.remapped = mode != "zeros" and (lo or hi)   # reflect / replicate / circular: no masks

    def remap(self, i: str) -> str:
        """Input index i folded back into [0, size) as the padding mode does."""
        n = self.size
        if self.mode == "reflect":
            return f"tl.where({i} < 0, -{i}, tl.where({i} >= {n}, 2 * {n} - 2 - {i}, {i}))"
        if self.mode == "replicate":
            return f"tl.minimum(tl.maximum({i}, 0), {n} - 1)"
        return f"tl.where({i} < 0, {i} + {n}, tl.where({i} >= {n}, {i} - {n}, {i}))"   # circular

    @property
    def count(self) -> str:
        """How many taps of this dim a program visits (a literal unless phased)."""
        return f"n_{self.v}" if self.phased else str(self.k)

    def tap(self, j: str) -> str:
        """The tap index k of this dim for visit number j."""
        return f"(k0_{self.v} + {j} * {self.step})" if self.phased else j

    def row_part(self) -> str:
        """The input index's part that depends on the output row only."""
        if self.t:
            return f"q_{self.v}"
        base = f"q_{self.v}" if self.s == 1 else f"q_{self.v} * {self.s}"
        return f"{base} - {self.lo}" if self.lo else base

    def tap_part(self, k: str) -> str:
        """The input index's part that depends on the tap k only."""
        if not self.t:
            return k if self.dil == 1 else f"{k} * {self.dil}"
        kd = k if self.dil == 1 else f"{k} * {self.dil}"
        if self.s == 1:
            return f"({self.lo} - {kd})"
        return f"((r_{self.v} + {self.lo} - {kd}) // {self.s})"   # exact: only dividing taps are visited

    def mask(self, i: str) -> list[str]:
        """Bounds checks input index i needs ([] where the geometry keeps it in range)."""
        lower = self.t or self.lo > 0
        upper = self.t or self.hi > 0
        return ([f"({i} >= 0)"] if lower else []) + ([f"({i} < {self.size})"] if upper else [])


class _Render:
    def __init__(self, fam, spec: KernelSpec, cfg: dict):
        self.fam, self.spec, self.cfg = fam, spec, cfg
        p = spec.params
        self.t = is_transposed(spec.op)
        mode = p.get("padding_mode", "zeros")
        self.dims = [_Dim(n, k, s, lo, hi, d, self.t, mode) for n, k, s, (lo, hi), d in zip(
            SPATIAL[rank(spec.op)], p["kernel"], p["stride"], p["padding"], p["dilation"])]
        self.phased = [d for d in self.dims if d.phased]
        self.phases = math.prod(d.s for d in self.phased)
        self.groups = fam.groups(spec)
        self.algo = cfg["ALGO"]
        self.direct = self.algo == "direct"
        self.split = int(cfg["SPLIT_K"])
        self.epi = fam.epilogue(spec)
        self.operands = [name for _, name, _ in operand_steps(self.epi)]
        # direct runs every group's channels as columns; the GEMM has a group axis in the grid
        self.grid_groups = 1 if self.direct else self.groups

    # -- the main kernel ---------------------------------------------------------------------
    def kernel(self) -> str:
        v = [d.v for d in self.dims]
        sizes = [d.size for d in self.dims] + [d.out for d in self.dims] + [d.q for d in self.dims]
        params = ["x_ptr", "w_ptr", *([] if self.split > 1 else [f"{o}_ptr" for o in self.operands]),
                  "partials_ptr" if self.split > 1 else "out_ptr", "N", "C_out", "CI_G", "CO_G", *sizes,
                  "sx_n", "sx_c", *(f"sx_{d}" for d in v), "sw_g", "sw_j", "sw_c", *(f"sw_{d}" for d in v),
                  *(f"{c}: tl.constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K",
                                                    "INDEX_64"))]
        cols = "C_out" if self.direct else "CO_G"
        m_expr = " * ".join(["N", *(d.q for d in self.dims)])
        body = ["# sizes in inline arithmetic, not tl.cdiv: each jit call costs the interpreter dearly",
                f"M = {m_expr}  # GEMM rows: output pixels (of one stride phase when transposed)",
                f"tiles = ((M + BLOCK_M - 1) // BLOCK_M) * (({cols} + BLOCK_N - 1) // BLOCK_N)",
                "# work item -> (tile, stride phase, group, K split); tiles vary fastest so programs",
                "# that run together share input rows and weights in L2",
                "w_item = tl.program_id(0)",
                "tile = w_item % tiles",
                "rest = w_item // tiles"]
        if self.phases > 1:
            body += [f"phase = rest % {self.phases}", f"rest = rest // {self.phases}"]
        body.append(f"g = rest % {self.grid_groups}" if self.grid_groups > 1 else "g = 0")
        body.append(f"split = rest // {self.grid_groups}" if self.grid_groups > 1 else "split = rest")
        body += [f"pid_m, pid_n = grouped_tile(tile, M, {cols}, BLOCK_M, BLOCK_N, GROUP_M)",
                 "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
                 "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
                 "rk = tl.arange(0, BLOCK_K)",
                 "row_ok = rm < M",
                 f"mask_n = rn < {cols}",
                 "# row -> (image n, position q in the output grid of this phase)",
                 "rest = rm"]
        for d in reversed(self.dims[1:]):
            body += [f"q_{d.v} = rest % {d.q}", f"rest = rest // {d.q}"]
        first = self.dims[0]
        body += [f"q_{first.v} = rest % {first.q}", "n = rest // " + first.q]
        body += self._phase_lines()
        body += self._k_walk()
        body += self._store()
        return "@triton.jit\n" + signature("conv_kernel", params) + "\n" + "\n".join(indent(body)) + "\n"

    def _phase_lines(self) -> list[str]:
        """Output positions; for a transposed conv the stride phase and the taps that reach it."""
        lines = []
        if self.phased:
            lines += ["# stride phase r: this program's outputs o = q * stride + r; tap k reaches o",
                      "# from input (o + pad - k * dilation) / stride exactly when that divides",
                      "ph = phase"]
            for d in reversed(self.phased):
                lines += [f"r_{d.v} = ph % {d.s}", f"ph = ph // {d.s}"]
        for d in self.dims:
            if d.phased:
                lines += [f"o_{d.v} = q_{d.v} * {d.s} + r_{d.v}", f"row_ok = row_ok & (o_{d.v} < {d.out})"]
            else:
                lines.append(f"o_{d.v} = q_{d.v}")
        for d in self.phased:
            if d.bound == 1:
                # stride divides dilation: every tap reaches the phase or none does.  Plain
                # arithmetic, not the search below: on the H200 (triton 3.6) three such searches
                # in one 3-D kernel gave taps to phases no tap reaches (task 77), though the
                # interpreter ran them right.
                lines += [f"k0_{d.v} = 0",
                          f"n_{d.v} = {d.k} * (((r_{d.v} + {d.lo}) % {d.s}) == 0).to(tl.int32)"]
                continue
            lines += [f"# first tap of dim {d.v} that reaches phase r_{d.v} (they repeat every {d.step})",
                      f"k0_{d.v} = r_{d.v} * 0 + {d.bound}",
                      f"for j in tl.static_range({d.bound}):",
                      f"    k0_{d.v} = tl.where((k0_{d.v} == {d.bound}) & ((r_{d.v} + {d.lo} - j * {d.dil}) % {d.s} == 0),"
                      f" j, k0_{d.v})",
                      f"n_{d.v} = tl.where(k0_{d.v} < {d.bound}, ({d.k} - k0_{d.v} + {d.step - 1}) // {d.step}, 0)"]
        for d in self.dims:
            lines.append(f"i0_{d.v} = {d.row_part()}")
        return lines

    def _taps(self, t: str) -> list[str]:
        """Lines turning tap number t (over the visited taps, last dim fastest) into k_<dim>."""
        lines, inner = [], []
        for i, d in enumerate(reversed(self.dims)):
            j = t if not inner else f"({t} // ({' * '.join(inner)}))"
            j = j if i == len(self.dims) - 1 else f"{j} % {d.count}"
            lines.append(f"k_{d.v} = {d.tap(j)}")
            inner.append(d.count)
        return lines[::-1]

    def _n_taps(self) -> str:
        return " * ".join(d.count for d in self.dims)

    def _index_lines(self, flat: bool) -> tuple[list[str], str, str, str]:
        """(lines, the taps' input offset, the in-range mask, the rows-and-taps offset) for the
        current taps.  The input index is row part + tap part per dim, so the offset splits into
        the rows' (row_base, made once before the loop) plus the taps'; only zero-padded dims need
        bounds checks.  A dim padded by reflection (replicate, circular) folds its index back in
        range instead, which ties rows and taps: its offset is the last part, remapped index
        minus the rows' part (2-d [rows, taps] when `flat`)."""
        lines, offs, masks, both = [], [], [], []
        for d in self.dims:
            lines.append(f"a_{d.v} = {d.tap_part(f'k_{d.v}')}")
            checks = d.mask(f"i_{d.v}") if not d.remapped else []
            if checks or d.remapped:
                lines.append(f"i_{d.v} = i0_{d.v}[:, None] + a_{d.v}[None, :]" if flat else f"i_{d.v} = i0_{d.v} + a_{d.v}")
                masks += checks
            if d.remapped:
                row = f"i0_{d.v}[:, None]" if flat else f"i0_{d.v}"
                both.append(f"({d.remap(f'i_{d.v}')} - {row}) * sx_{d.v}")
            else:
                offs.append(f"a_{d.v} * sx_{d.v}")
        return lines, " + ".join(offs) or "0", " & ".join(masks), " + ".join(both)

    def _dot(self) -> list[str]:
        dt = self.spec.dtype
        lines = []
        if dt == "bfloat16":   # see matmul.BF16_UPCAST (triton#11584)
            lines += ["if INTERPRETED:  # the interpreter multiplies bf16 bit patterns (triton#11584)",
                      "    a, b = a.to(tl.float32), b.to(tl.float32)"]
        if dt == "float32":
            prec = self.cfg["PRECISION"]
            note = {"ieee": "IEEE fp32 products, no tf32", "tf32x3": "three TF32 products per fp32 product",
                    "tf32": "TF32 products: allowed by the spec"}[prec]
            lines.append(f'acc = tl.dot(a, b, acc=acc, input_precision="{prec}")  # {note}')
        else:
            lines.append("acc = tl.dot(a, b, acc=acc)  # tensor cores, fp32 accumulation")
        return lines

    def _k_walk(self) -> list[str]:
        n_taps = self._n_taps()
        x_row = "x_row = n.to(tl.int64) * sx_n if INDEX_64 else n * sx_n  # 64-bit past 2**31 elements"
        s_out = " * ".join(d.out for d in self.dims)
        lines = ["# the [N, C_out, *OS] output's row part (image, position); the channel's comes after",
                 f"S_out = {s_out}",
                 "out_row = (n.to(tl.int64) * C_out if INDEX_64 else n * C_out) * S_out + " + self._flat_position(),
                 "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"]
        if self.direct:
            lines += ["# direct: each output channel (a column) reads its group's input channels",
                      "g_col = rn // CO_G", "j_col = rn % CO_G", x_row,
                      f"iters = {n_taps} * CI_G  # (tap, input channel of the group) pairs"]
        elif self.algo == "taps":
            lines += ["x_row = (n.to(tl.int64) * sx_n if INDEX_64 else n * sx_n) + g * CI_G * sx_c",
                      "w_base = w_ptr + g * sw_g",
                      "chunks = (CI_G + BLOCK_K - 1) // BLOCK_K",
                      f"iters = {n_taps} * chunks  # taps outer, BLOCK_K channels inner"]
        else:
            lines += ["x_row = (n.to(tl.int64) * sx_n if INDEX_64 else n * sx_n) + g * CI_G * sx_c",
                      "w_base = w_ptr + g * sw_g",
                      f"taps = {n_taps}",
                      "KT = CI_G * taps  # K = (channel, tap), channels outer as the weight stores them",
                      "iters = (KT + BLOCK_K - 1) // BLOCK_K"]
        lines.append("row_base = x_row + " + " + ".join(f"i0_{d.v} * sx_{d.v}" for d in self.dims)
                     + "  # the rows' part of the input offset")
        lines += ["# each split walks its own run of iterations",
                  "per_split = (iters + SPLIT_K - 1) // SPLIT_K",
                  "lo = split * per_split",
                  "hi = tl.minimum(lo + per_split, iters)",
                  *interpreter_ints(["lo", "hi"]),
                  "for it in range(lo, hi):"]
        lines += indent(self._loop_body())
        return lines

    def _loop_body(self) -> list[str]:
        w_taps = " + ".join(f"k_{d.v} * sw_{d.v}" for d in self.dims)
        if self.direct:
            idx, offs, mask, both = self._index_lines(flat=False)
            offs += f" + {both}" if both else ""
            return ["ci = it % CI_G", "t = it // CI_G", *self._taps("t"), *idx,
                    f"ok = row_ok{' & ' + mask if mask else ''}",
                    f"a = tl.load(x_ptr + (row_base + {offs})[:, None] + ((g_col * CI_G + ci) * sx_c)[None, :],",
                    "            mask=ok[:, None] & mask_n[None, :], other=0.0).to(tl.float32)",
                    f"wv = tl.load(w_ptr + g_col * sw_g + j_col * sw_j + ci * sw_c + {w_taps},",
                    "             mask=mask_n, other=0.0).to(tl.float32)",
                    "acc += a * wv[None, :]"]
        if self.algo == "taps":
            idx, offs, mask, both = self._index_lines(flat=False)
            offs += f" + {both}" if both else ""
            return ["cc = it % chunks", "t = it // chunks", *self._taps("t"), *idx,
                    "c = cc * BLOCK_K + rk",
                    "mask_c = c < CI_G",
                    f"ok = row_ok{' & ' + mask if mask else ''}",
                    f"a = tl.load(x_ptr + (row_base + {offs})[:, None] + (c * sx_c)[None, :],",
                    "            mask=ok[:, None] & mask_c[None, :], other=0.0)",
                    f"b = tl.load(w_base + (c * sw_c)[:, None] + (rn * sw_j)[None, :] + {w_taps},",
                    "            mask=mask_c[:, None] & mask_n[None, :], other=0.0)",
                    *self._dot()]
        idx, offs, mask, both = self._index_lines(flat=True)
        return ["kk = it * BLOCK_K + rk", "mask_k = kk < KT", "c = kk // taps", "t = kk % taps",
                *self._taps("t"), *idx,
                f"a = tl.load(x_ptr + row_base[:, None] + (c * sx_c + {offs})[None, :]{' + ' + both if both else ''},",
                f"            mask=row_ok[:, None] & mask_k[None, :]{' & ' + mask if mask else ''}, other=0.0)",
                f"b = tl.load(w_base + (c * sw_c + {w_taps})[:, None] + (rn * sw_j)[None, :],",
                "            mask=mask_k[:, None] & mask_n[None, :], other=0.0)",
                *self._dot()]

    def _flat_position(self) -> str:
        p = f"o_{self.dims[0].v}"
        for d in self.dims[1:]:
            p = f"({p}) * {d.out} + o_{d.v}" if "*" in p or "+" in p else f"{p} * {d.out} + o_{d.v}"
        return p

    def _store(self) -> list[str]:
        co = "rn" if self.direct else "g * CO_G + rn"
        lines = [f"co = {co}",
                 "flat = out_row[:, None] + (co * S_out)[None, :]",
                 "mask = row_ok[:, None] & mask_n[None, :]"]
        if self.split > 1:
            lines += ["# fp32 partial tile; the reduction kernel sums the splits and applies the epilogue",
                      "numel = N * C_out * S_out",
                      "# split * numel passes 2**31 long before numel does (an H200 conv with SPLIT_K=16 read",
                      "# out of bounds): the product in 64 bits when the partials need it",
                      "split_base = split.to(tl.int64) * numel if INDEX_64 else split * numel",
                      "tl.store(partials_ptr + split_base + flat, acc, mask=mask)"]
            return lines
        if self.epi:
            lines.append("# epilogue on the fp32 tile")
        lines += ["x = acc", *self._epilogue("flat", "co[None, :]", "mask", "mask_n[None, :]"),
                  "tl.store(out_ptr + flat, x.to(out_ptr.dtype.element_ty), mask=mask)"]
        return lines

    def _epilogue(self, full_offs: str, co_offs: str, mask: str, co_mask: str) -> list[str]:
        lines, names = [], {}
        for i, name, _ in operand_steps(self.epi):
            offs, m = (co_offs, co_mask) if is_channel_step(self.epi[i]) else (full_offs, mask)
            lines.append(pointwise.operand_load(name, self.epi[i], offs, m))
            names[i] = name
        return lines + step_lines(self.epi, "x", names)

    # -- split-K reduction ----------------------------------------------------------------------
    def reduce_kernel(self) -> str:
        params = ["partials_ptr", *(f"{o}_ptr" for o in self.operands), "out_ptr", "numel", "S_out", "C_out",
                  "BLOCK: tl.constexpr", "INDEX_64: tl.constexpr", "SPLIT_K: tl.constexpr"]
        body = ["if INDEX_64:  # offsets reach 2**31: 32-bit ones would wrap",
                "    start = tl.program_id(0).to(tl.int64) * BLOCK",
                "else:",
                "    start = tl.program_id(0) * BLOCK",
                "offs = start + tl.arange(0, BLOCK)",
                "mask = offs < numel",
                "x = tl.load(partials_ptr + offs, mask=mask)",
                "for s in tl.static_range(1, SPLIT_K):",
                "    # s * numel in 64 bits when the partials pass 2**31 elements (32-bit would wrap)",
                "    x += tl.load(partials_ptr + (numel.to(tl.int64) * s if INDEX_64 else numel * s) + offs, mask=mask)"]
        if any(is_channel_step(s) for s in self.epi):
            body.append("co = (offs // S_out) % C_out  # the output channel of each element")
        body += self._epilogue("offs", "co", "mask", "mask")
        body.append("tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=mask)")
        return "@triton.jit\n" + signature("conv_splitk_reduce", params) + "\n" + "\n".join(indent(body)) + "\n"

    # -- launch ----------------------------------------------------------------------------------
    def launch(self) -> str:
        names = [a.name for a in self.fam.inputs(self.spec)]
        r = len(self.dims)
        lines = []
        if self.cfg["LAYOUT"] == "channels_last":
            perm, back = (0, *range(2, r + 2), 1), (0, r + 1, *range(1, r + 1))
            lines += ["# channels-last copies, read through their strides (the copy is part of the time)",
                      f"x = x.permute{perm}.contiguous().permute{back}",
                      f"w = w.permute{perm}.contiguous().permute{back}"]
        if self.operands:
            lines.append(f"{', '.join(self.operands)} = {', '.join(f'{o}.contiguous()' for o in self.operands)}"
                         "  # indexed like out, or by channel")
        sizes = ", ".join(d.size for d in self.dims)
        outs = ", ".join(d.out for d in self.dims)
        lines += ['assert out.is_contiguous(), "out must be contiguous"',
                  "N, C_in = x.shape[0], x.shape[1]",
                  f"{sizes}{',' if r == 1 else ''} = x.shape[2:]",
                  "C_out = out.shape[1]",
                  f"{outs}{',' if r == 1 else ''} = out.shape[2:]",
                  f"CI_G, CO_G = C_in // {self.groups}, C_out // {self.groups}  # channels per group"]
        for d in self.dims:
            lines.append(f"{d.q} = triton.cdiv({d.out}, {d.s})  # outputs per stride phase" if d.phased
                         else f"{d.q} = {d.out}")
        cols = "C_out" if self.direct else "CO_G"
        m = " * ".join(["N", *(d.q for d in self.dims)])
        lines += [f"BLOCK_M, BLOCK_N, SPLIT_K = {self.cfg['BLOCK_M']}, {self.cfg['BLOCK_N']}, {self.split}",
                  f"work = triton.cdiv({m}, BLOCK_M) * triton.cdiv({cols}, BLOCK_N) * "
                  f"{self.phases * self.grid_groups} * SPLIT_K",
                  "if work == 0 or out.numel() == 0:",
                  "    return",
                  "numel = out.numel()",
                  "INDEX_64 = max(x.numel(), SPLIT_K * numel) + BLOCK_M * BLOCK_N >= 2**31"]
        if self.t:
            wstrides = "sw_g, sw_j, sw_c = CI_G * w.stride(0), w.stride(1), w.stride(0)  # w is [C_in, C_out/G, *k]"
        else:
            wstrides = "sw_g, sw_j, sw_c = CO_G * w.stride(0), w.stride(0), w.stride(1)  # w is [C_out, C_in/G, *k]"
        lines.append(wstrides)
        target = "partials" if self.split > 1 else ", ".join([*self.operands, "out"])
        if self.split > 1:
            lines.append("partials = torch.empty((SPLIT_K, numel), device=out.device, dtype=torch.float32)")
        lines += [f"conv_kernel[(work,)](x, w, {target}, N, C_out, CI_G, CO_G, {sizes}, {outs}, "
                  + ", ".join(d.q for d in self.dims) + ",",
                  f"                     x.stride(0), x.stride(1), *x.stride()[2:], sw_g, sw_j, sw_c, *w.stride()[2:],",
                  "                     BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, "
                  f"BLOCK_K={self.cfg['BLOCK_K']}, GROUP_M={self.cfg['GROUP_M']},",
                  "                     SPLIT_K=SPLIT_K, INDEX_64=INDEX_64, "
                  f"num_warps={self.cfg['num_warps']}, num_stages={self.cfg['num_stages']})"]
        if self.split > 1:
            lines += [f"conv_splitk_reduce[(triton.cdiv(numel, {REDUCE_BLOCK}),)](",
                      f"    partials, {', '.join([*self.operands, 'out'])}, numel, {' * '.join(outs.split(', '))}, "
                      f"C_out, BLOCK={REDUCE_BLOCK},",
                      "    INDEX_64=INDEX_64, SPLIT_K=SPLIT_K, num_warps=4)"]
        return signature("launch", [*names, "*", "out"]) + "\n" + "\n".join(indent(lines)) + "\n"

    def header(self) -> str:
        return f"# {self.fam.describe(self.spec)}\n# config: {config_line(self.cfg)}\n"


def render(fam, spec: KernelSpec, cfg: dict) -> str:
    r = _Render(fam, spec, cfg)
    blocks = [INTERPRETED_SOURCE, GROUPED_TILE_SOURCE, r.kernel()]
    if r.split > 1:
        blocks.append(r.reduce_kernel())
    blocks.append(r.launch())
    return r.header() + "import os\n" + IMPORTS + "\n\n" + "\n\n\n".join(b.strip("\n") for b in blocks) + "\n"


__all__ = ["render", "out_names"]
