"""The norm family's split template: statistics over sets of elements too large (or too strided)
for one program, then a normalize pass.  Used by batch, group and instance norms, Frobenius
normalization, and by layer / RMS / L1 / L2 norms whose rows are few and long.

Every such norm reads x as a contiguous [P, T, Q] view for its statistics: statistic t covers
x[:, t, :] (batch norm: [N, C, S], one statistic per channel over batch and space; group norm:
[1, N * G, C / G * S], one per (image, group), a contiguous row; a row norm: [1, M, N]).  Three
kernels:
  1. norm_stats, grid (T / BLOCK_T, SPLIT): each program walks its share of the (p, q) tiles of
     its BLOCK_T statistics and writes a partial (count, mean, M2) -- or (count, sum) for the
     sum-of-squares / sum-of-|x| norms -- so a statistic over millions of elements still spreads
     over the whole GPU.  Per-lane sums are shifted by the first tile's mean, so the M2 of data
     whose mean is large next to its spread does not cancel away in fp32.
  2. norm_finalize: merges the SPLIT partials per statistic (Chan et al.'s parallel update) into
     a shift and a scale ((x - shift) * scale normalizes); batch norm in training mode updates
     its running buffers here exactly as PyTorch does (momentum, unbiased variance), in eval
     mode it reads them instead of any statistics.
  3. norm_apply: one pass over x as the [P2, T2, Q2] view of its output layout, statistic
     p * SA + t // SB per (p, t) (batch norm: t; group norm: n * G + c // (C / G)), the affine
     weight by t (a channel) or by q (a row norm's [N] weight), the pointwise epilogue, store.
Sizes come from the tensors at launch; fp32 statistics whatever the dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

from mtmc.kernels import pointwise
from mtmc.kernels.families.elementwise import (
    IMPORTS, INTERPRETED_SOURCE, indent, interpreter_ints, operand_steps, signature,
)

FINALIZE_BLOCK = 128    # statistics per finalize program
FINALIZE_SPLITS = 32    # partials it merges per step (a [FINALIZE_SPLITS, FINALIZE_BLOCK] tile)


@dataclass(frozen=True)
class Layout:
    """How one spec maps onto the template (plain strings of host / Triton code).

    stat:      "meanvar" (mean and variance), "sumsq" or "sumabs" (one sum per statistic)
    sizes:     launch line(s) reading the sizes from x (e.g. "NB, C, S = x.shape")
    stats_view / apply_view: (P, T, Q) host expressions of the two views
    stat_of:   (SA, SB) host expressions: the apply pass's (p, t) reads statistic p * SA + t // SB
    scale:     Triton expression of the scale from fp32 `count`, `mean` (or the sum `acc`) and `m2`
    shifted:   whether x - mean is taken (meanvar) or x is only scaled
    weight_by: "t", "q" or "" (no affine vectors)
    vectors:   the affine input names (weight, bias) in input order
    running:   "" | "update" (training: running buffers as launch keywords) | "read" (eval: inputs)
    prologue:  operand-free pointwise steps applied to x before the statistics and the normalize
    """
    stat: str
    sizes: str
    stats_view: tuple[str, str, str]
    apply_view: tuple[str, str, str]
    stat_of: tuple[str, str]
    scale: str
    weight_by: str
    vectors: tuple[str, ...]
    inputs: tuple[str, ...]
    epilogue: tuple
    epi_names: dict
    running: str = ""
    prologue: tuple = ()
    eps: float = 0.0
    momentum: float | None = 0.1


def _prologue(lay: Layout) -> list[str]:
    if not lay.prologue:
        return []
    return [f"x = {pointwise.triton_expr(list(lay.prologue), 'x', {})}"]


def _tile_lines(p: str, t: str, q: str) -> list[str]:
    """The [BLOCK_P, BLOCK_T, BLOCK_Q] tile's offsets (64-bit) and mask, from index vectors."""
    return [f"rows = ({p}[:, None] * T + {t}[None, :]).to(tl.int64) * Q  # element offsets can pass 2**31",
            f"offs = rows[:, :, None] + {q}[None, None, :]",
            f"mask = (({p} < P)[:, None] & ({t} < T)[None, :])[:, :, None] & ({q} < Q)[None, None, :]"]


def stats_kernel(lay: Layout) -> str:
    meanvar = lay.stat == "meanvar"
    load = ["x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)", *_prologue(lay)]
    if lay.prologue:
        load.append("x = tl.where(mask, x, 0.0)  # padding must not count")
    item = ["pb = it // qblocks",
            "qb = it - pb * qblocks",
            "p = pb * BLOCK_P + tl.arange(0, BLOCK_P)",
            "q = qb * BLOCK_Q + tl.arange(0, BLOCK_Q)",
            *_tile_lines("p", "t", "q"), *load,
            "# valid (p, q) pairs of this tile: the same for every statistic t",
            "count = (tl.minimum(P - pb * BLOCK_P, BLOCK_P) * tl.minimum(Q - qb * BLOCK_Q, BLOCK_Q)).to(tl.float32)"]
    body = ["t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)",
            "split = tl.program_id(1)",
            "qblocks = (Q + BLOCK_Q - 1) // BLOCK_Q",
            "items = ((P + BLOCK_P - 1) // BLOCK_P) * qblocks  # (p, q) tiles of each statistic",
            "per = (items + SPLIT - 1) // SPLIT",
            "lo = split * per",
            "hi = tl.minimum(lo + per, items)",
            "n = tl.zeros([BLOCK_T], dtype=tl.float32)",
            "acc = tl.zeros([BLOCK_P, BLOCK_T, BLOCK_Q], dtype=tl.float32)"]
    if meanvar:
        body += ["# shift: the first tile's mean per statistic, so sum((x - K)^2) does not cancel",
                 "it = lo",
                 *item,
                 "K = tl.sum(tl.sum(x, axis=2), axis=0) / tl.maximum(count, 1.0)  # (an empty split: 0)",
                 "acc2 = tl.zeros([BLOCK_P, BLOCK_T, BLOCK_Q], dtype=tl.float32)"]
        step = ["xk = tl.where(mask, x - K[None, :, None], 0.0)", "acc += xk", "acc2 += xk * xk"]
    else:
        step = ["acc += " + ("x * x" if lay.stat == "sumsq" else "tl.abs(x)")]
    body += [*interpreter_ints(["lo", "hi"]),
             "for it in range(lo, hi):",
             *indent([*item, *step, "n += count"])]
    body.append("s1 = tl.sum(tl.sum(acc, axis=2), axis=0)")
    if meanvar:
        body += ["s2 = tl.sum(tl.sum(acc2, axis=2), axis=0)",
                 "safe = tl.maximum(n, 1.0)",
                 "mean = K + s1 / safe",
                 "m2 = tl.maximum(s2 - s1 * s1 / safe, 0.0)"]
    else:
        body += ["mean = s1  # the sum", "m2 = s1 * 0.0"]
    body += ["t_mask = t < T",
             "base = part_ptr + split * 3 * T + t",
             "tl.store(base, n, mask=t_mask)",
             "tl.store(base + T, mean, mask=t_mask)",
             "tl.store(base + 2 * T, m2, mask=t_mask)"]
    params = ["x_ptr", "part_ptr", "P", "T", "Q", "SPLIT",
              "BLOCK_P: tl.constexpr", "BLOCK_T: tl.constexpr", "BLOCK_Q: tl.constexpr"]
    return "@triton.jit\n" + signature("norm_stats", params) + "\n" + "\n".join(indent(body)) + "\n"


def finalize_kernel(lay: Layout) -> str:
    read = lay.running == "read"
    update = lay.running == "update"
    body = ["t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "t_mask = t < T"]
    if read:  # eval-mode batch norm: the running statistics, no pass over x
        body += ["mean = tl.load(rm_ptr + t, mask=t_mask, other=0.0).to(tl.float32)",
                 "var = tl.load(rv_ptr + t, mask=t_mask, other=1.0).to(tl.float32)",
                 "scale = 1.0 / tl.sqrt(var + eps)"]
    else:
        meanvar = lay.stat == "meanvar"
        body += ["count = tl.zeros([BLOCK], dtype=tl.float32)",
                 "mean = tl.zeros([BLOCK], dtype=tl.float32)",
                 "m2 = tl.zeros([BLOCK], dtype=tl.float32)",
                 *interpreter_ints(["SPLIT"]),
                 "for s0 in range(0, SPLIT, SPLITS):  # SPLITS partials at a time, merged into the running state",
                 *indent(["s = s0 + tl.arange(0, SPLITS)",
                          "m = (s < SPLIT)[:, None] & t_mask[None, :]",
                          "base = part_ptr + (s * 3 * T)[:, None] + t[None, :]",
                          "c = tl.load(base, mask=m, other=0.0)",
                          "mu = tl.load(base + T, mask=m, other=0.0)",
                          "cs = tl.sum(c, axis=0)"]),
                 *indent(["# the chunk's (count, mean, M2): M2s add up plus each partial's spread about the mean",
                          "cmean = tl.sum(c * mu, axis=0) / tl.maximum(cs, 1.0)",
                          "d = tl.where(m, mu - cmean[None, :], 0.0)",
                          "cm2 = tl.sum(tl.load(base + 2 * T, mask=m, other=0.0) + c * d * d, axis=0)",
                          "# Chan et al.'s merge into the running state",
                          "seen = count + cs",
                          "frac = tl.where(seen > 0, cs / tl.maximum(seen, 1.0), 0.0)",
                          "delta = cmean - mean",
                          "mean += delta * frac",
                          "m2 += cm2 + delta * delta * count * frac",
                          "count = seen"] if meanvar else
                         ["mean += tl.sum(mu, axis=0)  # sums add up", "count += cs"]),
                 f"scale = {lay.scale}"]
        if lay.stat != "meanvar":
            body.append("mean = mean * 0.0  # scaled only, never shifted")
    if update:
        body += ["# running buffers, as torch.nn.functional.batch_norm updates them in training mode",
                 "rm = tl.load(rm_ptr + t, mask=t_mask, other=0.0).to(tl.float32)",
                 "rv = tl.load(rv_ptr + t, mask=t_mask, other=0.0).to(tl.float32)",
                 "unbiased = m2 / tl.maximum(count - 1.0, 1.0)",
                 "tl.store(rm_ptr + t, ((1.0 - momentum) * rm + momentum * mean).to(rm_ptr.dtype.element_ty), "
                 "mask=t_mask)",
                 "tl.store(rv_ptr + t, ((1.0 - momentum) * rv + momentum * unbiased).to(rv_ptr.dtype.element_ty), "
                 "mask=t_mask)"]
    body += ["tl.store(shift_ptr + t, mean, mask=t_mask)", "tl.store(scale_ptr + t, scale, mask=t_mask)"]
    params = ["part_ptr", *(["rm_ptr", "rv_ptr"] if read or update else []), "shift_ptr", "scale_ptr", "T",
              "SPLIT", "eps", *(["momentum"] if update else []), "BLOCK: tl.constexpr", "SPLITS: tl.constexpr"]
    return "@triton.jit\n" + signature("norm_finalize", params) + "\n" + "\n".join(indent(body)) + "\n"


def apply_kernel(lay: Layout) -> str:
    epi = list(lay.epilogue)
    ops = [lay.epi_names.get(i, name) for i, name, _ in operand_steps(epi)]
    body = ["pid = tl.program_id(0)",
            "qblocks = (Q + BLOCK_Q - 1) // BLOCK_Q",
            "tblocks = (T + BLOCK_T - 1) // BLOCK_T",
            "q = (pid % qblocks) * BLOCK_Q + tl.arange(0, BLOCK_Q)",
            "rest = pid // qblocks",
            "t = (rest % tblocks) * BLOCK_T + tl.arange(0, BLOCK_T)",
            "p = (rest // tblocks) * BLOCK_P + tl.arange(0, BLOCK_P)",
            *_tile_lines("p", "t", "q"),
            "pt_mask = (p < P)[:, None] & (t < T)[None, :]",
            "srow = p[:, None] * SA + t[None, :] // SB  # the statistic of each (p, t)",
            "shift = tl.load(shift_ptr + srow, mask=pt_mask, other=0.0)[:, :, None]",
            "scale = tl.load(scale_ptr + srow, mask=pt_mask, other=0.0)[:, :, None]",
            "x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)",
            *_prologue(lay),
            "y = (x - shift) * scale" if lay.stat == "meanvar" else "y = x * scale"]
    if lay.vectors:
        idx, shape = ("t", "[None, :, None]") if lay.weight_by == "t" else ("q", "[None, None, :]")
        vmask = f"{idx} < {'T' if idx == 't' else 'Q'}"
        for v in lay.vectors:
            body.append(f"{v} = tl.load({v}_ptr + {idx}, mask={vmask}, other=0.0).to(tl.float32){shape}")
        body.append("y = y * weight" + (" + bias" if "bias" in lay.vectors else ""))
    names = {}
    for (i, default, kind), name in zip(operand_steps(epi), ops):
        offs = pointwise.periodic_offsets(epi[i], "offs") if kind == "periodic" else "offs"
        body.append(pointwise.operand_load(name, epi[i], offs, "mask"))
        names[i] = name
    body += [f"y = {pointwise.triton_expr([step], 'y', {0: names[i]} if i in names else {})}"
             for i, step in enumerate(epi)]
    body.append("tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)")
    params = ["x_ptr", "shift_ptr", "scale_ptr", *(f"{v}_ptr" for v in lay.vectors), *(f"{o}_ptr" for o in ops),
              "out_ptr", "P", "T", "Q", "SA", "SB",
              "BLOCK_P: tl.constexpr", "BLOCK_T: tl.constexpr", "BLOCK_Q: tl.constexpr"]
    return "@triton.jit\n" + signature("norm_apply", params) + "\n" + "\n".join(indent(body)) + "\n"


def tile(view: tuple[int, int, int], budget: int, max_t: int = 256) -> tuple[int, int, int]:
    """(BLOCK_P, BLOCK_T, BLOCK_Q) of about `budget` elements for a [P, T, Q] view: contiguous q
    first, then neighbouring statistics t (coalesced when Q is short), then batch rows p."""
    P, T, Q = view
    bq = min(_pow2(Q), budget)
    bt = min(_pow2(T), max(1, budget // bq), max_t)
    bp = min(_pow2(P), max(1, budget // (bq * bt)))
    return bp, bt, bq


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def launch(lay: Layout, cfg: dict, apply_tile: tuple[int, int, int]) -> str:
    names = list(lay.inputs)
    kw = ["*", "out"]
    if lay.running == "update":
        kw += ["running_mean=None", "running_var=None", "num_batches_tracked=None"]
    lines = [*lay.sizes.splitlines(),
             'assert x.is_contiguous() and out.is_contiguous(), "the norm kernels read x and write out as contiguous"',
             f"P1, T1, Q1 = {', '.join(lay.stats_view)}  # statistics view: one statistic per t",
             f"P2, T2, Q2 = {', '.join(lay.apply_view)}  # normalize view",
             f"SA, SB = {', '.join(lay.stat_of)}  # (p, t) of the normalize view reads statistic p * SA + t // SB",
             "shift = torch.empty(T1, device=x.device, dtype=torch.float32)",
             "scale = torch.empty(T1, device=x.device, dtype=torch.float32)",
             f"SPLIT = {cfg['SPLIT']}"]
    if lay.running == "read":
        lines.append("part = shift  # unused: eval mode reads the running statistics")
        rm = "running_mean, running_var, "
    else:
        lines += ["part = torch.empty((SPLIT, 3, T1), device=x.device, dtype=torch.float32)  # partial statistics",
                  f"BLOCK_P, BLOCK_T, BLOCK_Q = {cfg['BLOCK_P']}, {cfg['BLOCK_T']}, {cfg['BLOCK_Q']}",
                  "norm_stats[(triton.cdiv(T1, BLOCK_T), SPLIT)](x, part, P1, T1, Q1, SPLIT, BLOCK_P=BLOCK_P, "
                  f"BLOCK_T=BLOCK_T, BLOCK_Q=BLOCK_Q, num_warps={cfg['num_warps']})"]
        rm = ""
    momentum = ""
    if lay.running == "update":
        lines += ["update = running_mean is not None and running_var is not None",
                  "if num_batches_tracked is not None:",
                  "    num_batches_tracked.add_(1)  # PyTorch's counter of training batches"]
        if lay.momentum is None:   # a cumulative average: 1 / batches seen
            lines += ["momentum = 1.0 / float(num_batches_tracked) if num_batches_tracked is not None else 0.0"]
        else:
            lines += [f"momentum = {lay.momentum!r}"]
        lines += ["if not update:  # nothing to update: the kernel writes to scratch copies",
                  "    running_mean, running_var = torch.zeros((2, T1), device=x.device, dtype=torch.float32)"]
        rm, momentum = "running_mean, running_var, ", ", momentum"
    lines += [f"norm_finalize[(triton.cdiv(T1, {FINALIZE_BLOCK}),)](part, {rm}shift, scale, T1, SPLIT, {lay.eps!r}"
              f"{momentum}, BLOCK={FINALIZE_BLOCK}, SPLITS={min(_pow2(cfg['SPLIT']), FINALIZE_SPLITS)})"]
    bp, bt, bq = apply_tile
    epi_ops = [lay.epi_names.get(i, name) for i, name, _ in operand_steps(list(lay.epilogue))]
    args = ", ".join(["x", "shift", "scale", *lay.vectors, *epi_ops, "out", "P2", "T2", "Q2", "SA", "SB"])
    lines += [f"grid = (triton.cdiv(P2, {bp}) * triton.cdiv(T2, {bt}) * triton.cdiv(Q2, {bq}),)",
              f"norm_apply[grid]({args},",
              f"                 BLOCK_P={bp}, BLOCK_T={bt}, BLOCK_Q={bq}, num_warps={cfg['norm_warps']})"]
    return signature("launch", [*names, *kw]) + "\n" + "\n".join(indent(lines)) + "\n"


def render(lay: Layout, cfg: dict, apply_tile: tuple[int, int, int], header: str) -> str:
    blocks = [INTERPRETED_SOURCE]
    if lay.running != "read":
        blocks.append(stats_kernel(lay))
    blocks += [finalize_kernel(lay), apply_kernel(lay), launch(lay, cfg, apply_tile)]
    return header + "import os\n" + IMPORTS + "\n\n" + "\n\n\n".join(b.strip("\n") for b in blocks) + "\n"
