"""Triton source of the loss family (kernels.families.loss): the per-item kernel (flat for
elementwise losses, row-wise for the others), the one-program finishing pass, and the launcher;
plus the op table every piece of the family reads."""
from __future__ import annotations

from mtmc.kernels.families.elementwise import (
    IMPORTS, INTERPRETED_SOURCE, SM_COUNT_SOURCE, indent, interpreter_ints, operand_loads, signature, step_lines,
)
from mtmc.kernels.spec import KernelSpec

ELEMENTWISE = ("mse", "l1", "smooth_l1", "huber", "kl_div", "hinge_embedding", "total")
ROWWISE = ("cross_entropy", "triplet_margin", "cosine_similarity", "cosine_embedding")
REDUCTIONS = ("mean", "sum", "none", "batchmean")
# op -> {param: default}; every other param is refused
PARAMS = {"mse": {}, "l1": {}, "smooth_l1": {"beta": 1.0}, "huber": {"delta": 1.0},
          "kl_div": {"log_target": False, "log_input": False}, "hinge_embedding": {"margin": 1.0},
          "total": {"prologue": []}, "cross_entropy": {"ignore_index": -100, "label_smoothing": 0.0, "epilogue": []},
          "triplet_margin": {"margin": 1.0, "p": 2.0, "eps": 1e-6, "swap": False, "epilogue": []},
          "cosine_similarity": {"eps": 1e-8, "epilogue": []}, "cosine_embedding": {"margin": 0.0, "epilogue": []}}
TORCH_NAMES = {"mse": "mse_loss", "l1": "l1_loss", "smooth_l1": "smooth_l1_loss", "huber": "huber_loss",
               "kl_div": "kl_div", "hinge_embedding": "hinge_embedding_loss", "cross_entropy": "cross_entropy",
               "triplet_margin": "triplet_margin_loss", "cosine_embedding": "cosine_embedding_loss"}
COSINE_EMBEDDING_EPS = 1e-12   # PyTorch's cosine_embedding_loss adds it to both squared norms
FINISH_BLOCK = 1024
BLOCKS = [256, 512, 1024, 2048, 4096, 8192]
WAVES = [1, 2, 4, 8]


def is_rowwise(spec: KernelSpec) -> bool:
    return spec.op in ROWWISE


def param(spec: KernelSpec, key: str):
    return spec.params.get(key, PARAMS[spec.op][key])


def reduction(spec: KernelSpec) -> str:
    return spec.params.get("reduction", "mean")



def counted(spec: KernelSpec) -> bool:
    """A cross-entropy mean divides by the rows whose target is not ignore_index (PyTorch's)."""
    return spec.op == "cross_entropy" and reduction(spec) == "mean" and not spec.params.get("epilogue")


def _num(v) -> str:
    return repr(float(v))


# -- elementwise losses: fp32 `x`, `y` -> `v` -----------------------------------------------------
def _elementwise_lines(spec: KernelSpec) -> list[str]:
    op = spec.op
    if op == "mse":
        return ["d = x - y", "v = d * d"]
    if op == "l1":
        return ["v = tl.abs(x - y)"]
    if op == "smooth_l1":
        beta = float(param(spec, "beta"))
        if beta == 0:
            return ["v = tl.abs(x - y)"]
        return ["d = tl.abs(x - y)", f"v = tl.where(d < {beta!r}, 0.5 * d * d / {beta!r}, d - {0.5 * beta!r})"]
    if op == "huber":
        delta = float(param(spec, "delta"))
        return ["d = tl.abs(x - y)", f"v = tl.where(d < {delta!r}, 0.5 * d * d, {delta!r} * (d - {0.5 * delta!r}))"]
    if op == "kl_div":
        lines = ["x = tl.log(x)  # the module's log of the probabilities"] if param(spec, "log_input") else []
        if param(spec, "log_target"):
            return [*lines, "v = tl.exp(y) * (y - x)"]
        # xlogy: a zero target contributes 0, as PyTorch's does
        return [*lines, "v = tl.where(y > 0.0, y * tl.log(tl.where(y > 0.0, y, 1.0)), 0.0) - y * x"]
    if op == "hinge_embedding":
        margin = _num(param(spec, "margin"))
        return [f"v = tl.where(y != 1.0, tl.maximum({margin} - x, 0.0), 0.0) + tl.where(y != -1.0, x, 0.0)"]
    raise ValueError(op)


def _flat_kernel(spec: KernelSpec, names: list[str]) -> list[str]:
    none = reduction(spec) == "none"
    loads = [f"{n} = tl.load({n}_ptr + offs, mask=mask, other=0.0).to(tl.float32)" for n in names[:2]]
    if spec.op == "kl_div" and param(spec, "log_input"):   # padding lanes: log(1) = 0, not -inf
        loads[0] = loads[0].replace("other=0.0", "other=1.0")
    if spec.op == "total":
        chain = spec.params["prologue"]
        extra = operand_loads(chain, "offs", "offs % N", "mask", "mask")
        value = [loads[0], *extra[0], *step_lines(chain, "x", extra[1]), "v = x"]
    else:
        value = [*loads, *_elementwise_lines(spec)]
    body = ["if INDEX_64:  # offsets reach 2**31: 32-bit ones would wrap",
            "    offs = (tl.zeros([BLOCK], dtype=tl.int64) + block) * BLOCK + tl.arange(0, BLOCK)",
            "else:  # 32-bit offsets: a broadcast operand's modulo stays cheap",
            "    offs = block * BLOCK + tl.arange(0, BLOCK)",
            "mask = offs < T", *value,
            "tl.store(out_ptr + offs, v.to(out_ptr.dtype.element_ty), mask=mask)" if none
            else "acc += tl.where(mask, v, 0.0)"]
    lines = ["first, blocks, stride = tl.program_id(0), tl.cdiv(T, BLOCK), tl.num_programs(0)",
             *interpreter_ints(["first", "blocks", "stride"]),
             "acc = tl.zeros([BLOCK], dtype=tl.float32)",
             "for block in range(first, blocks, stride):  # a fixed grid strides over the chunks",
             *indent(body)]
    if not none:
        lines.append("tl.store(partial_ptr + first, tl.sum(acc, axis=0))  # this program's partial sum")
    params = [*(f"{n}_ptr" for n in names), "out_ptr", "partial_ptr", "T", "N", "BLOCK: tl.constexpr",
              "INDEX_64: tl.constexpr"]
    return ["@triton.jit", signature("loss_kernel", params), *indent(lines)]


# -- row losses: accumulators over column chunks, then one value `v` per row -----------------------
def _norm_pow(var: str, p: float) -> str:
    return {1.0: f"tl.abs({var})", 2.0: f"{var} * {var}"}.get(p, f"tl.exp({p!r} * tl.log(tl.abs({var})))")


def _norm_root(var: str, p: float) -> str:
    return {1.0: var, 2.0: f"tl.sqrt({var})"}.get(p, f"tl.exp(tl.log({var}) / {p!r})")


def _row_pieces(spec: KernelSpec) -> tuple[list[str], list[str], list[str]]:
    """(accumulator inits, per-chunk lines, lines computing `v` [ROWS_PER_PROG] at the end)."""
    tile = "[ROWS_PER_PROG, BLOCK_N]"
    load = "{n} = tl.load({n}_ptr + rows64[:, None] * stride_{n} + cols[None, :], mask=mask, other={o}).to(tl.float32)"
    if spec.op == "cross_entropy":
        ignore = int(param(spec, "ignore_index"))
        init = ['row_max = tl.full([ROWS_PER_PROG], float("-inf"), tl.float32)',
                "denom = tl.zeros([ROWS_PER_PROG], dtype=tl.float32)"]
        step = [load.format(n="x", o='float("-inf")'),
                "new_max = tl.maximum(row_max, tl.max(x, axis=1))",
                "denom = denom * tl.exp(row_max - new_max) + tl.sum(tl.exp(x - new_max[:, None]), axis=1)",
                "row_max = new_max"]
        end = [f"t = tl.load(target_ptr + rows64, mask=row_mask, other={ignore})",
               f"keep = row_mask & (t != {ignore}) & (t >= 0) & (t < N)",
               "picked = tl.load(x_ptr + rows64 * stride_x + t, mask=keep, other=0.0).to(tl.float32)",
               "v = tl.where(keep, row_max + tl.log(denom) - picked, 0.0)"]
        eps = float(param(spec, "label_smoothing"))
        if eps:   # (1 - e) * nll + e * mean over classes of -log p = lse - (1 - e) x_t - e * mean(x)
            init.append("row_sum = tl.zeros([ROWS_PER_PROG], dtype=tl.float32)")
            step.append("row_sum += tl.sum(tl.where(mask, x, 0.0), axis=1)")
            end[-1] = (f"v = tl.where(keep, row_max + tl.log(denom) - {_num(1.0 - eps)} * picked"
                       f" - {_num(eps)} * (row_sum / N), 0.0)")
        return init, step, end
    if spec.op == "triplet_margin":
        p, eps = float(param(spec, "p")), _num(param(spec, "eps"))
        pairs = [("ap", "anchor", "positive"), ("an", "anchor", "negative")]
        pairs += [("pn", "positive", "negative")] if param(spec, "swap") else []
        init = [f"acc_{k} = tl.zeros({tile}, dtype=tl.float32)" for k, _, _ in pairs]
        step = [load.format(n=n, o="0.0") for n in ("anchor", "positive", "negative")]
        for k, a, b in pairs:   # pairwise_distance adds eps to the difference
            step += [f"d = {a} - {b} + {eps}", f"acc_{k} += tl.where(mask, {_norm_pow('d', p)}, 0.0)"]
        end = [f"dist_{k} = {_norm_root(f'tl.sum(acc_{k}, axis=1)', p)}" for k, _, _ in pairs]
        if param(spec, "swap"):
            end.append("dist_an = tl.minimum(dist_an, dist_pn)")
        end.append(f"v = tl.maximum(dist_ap - dist_an + {_num(param(spec, 'margin'))}, 0.0)")
        return init, step, end
    init = [f"acc_{k} = tl.zeros({tile}, dtype=tl.float32)" for k in ("dot", "xx", "yy")]
    step = [load.format(n="x1", o="0.0"), load.format(n="x2", o="0.0"),
            "acc_dot += x1 * x2", "acc_xx += x1 * x1", "acc_yy += x2 * x2"]
    end = [f"{k} = tl.sum(acc_{k}, axis=1)" for k in ("dot", "xx", "yy")]
    if spec.op == "cosine_similarity":
        eps2 = _num(float(param(spec, "eps")) ** 2)
        return init, step, [*end, f"v = dot / tl.sqrt(tl.maximum(xx, {eps2}) * tl.maximum(yy, {eps2}))"]
    margin, e = _num(param(spec, "margin")), _num(COSINE_EMBEDDING_EPS)
    end += [f"cos = dot / tl.sqrt((xx + {e}) * (yy + {e}))",
            "y = tl.load(y_ptr + rows64, mask=row_mask, other=0.0).to(tl.float32)",
            f"v = tl.where(y == 1.0, 1.0 - cos, 0.0) + tl.where(y == -1.0, tl.maximum(cos - {margin}, 0.0), 0.0)"]
    return init, step, end


def full_inputs(spec: KernelSpec, names: list[str]) -> list[str]:
    return [n for n in names if n not in ("target", "y") or spec.op not in ("cross_entropy", "cosine_embedding")]


def _rows_kernel(spec: KernelSpec, names: list[str]) -> list[str]:
    init, step, end = _row_pieces(spec)
    epi = spec.params.get("epilogue", [])
    lines = ["group = tl.program_id(0)",
             "rows = group * ROWS_PER_PROG + tl.arange(0, ROWS_PER_PROG)",
             "row_mask = rows < M",
             "rows64 = rows.to(tl.int64)  # element offsets can pass 2**31",
             *interpreter_ints(["N"]), *init,
             "for start in range(0, N, BLOCK_N):",
             *indent(["cols = start + tl.arange(0, BLOCK_N)",
                      "mask = row_mask[:, None] & (cols < N)[None, :]", *step]),
             *end, *step_lines(epi, "v", {})]
    if reduction(spec) == "none":
        lines.append("tl.store(out_ptr + rows64, v.to(out_ptr.dtype.element_ty), mask=row_mask)")
    else:
        lines.append("tl.store(partial_ptr + group, tl.sum(tl.where(row_mask, v, 0.0), axis=0))  # this program's part")
        if counted(spec):
            lines.append("tl.store(partial_ptr + tl.num_programs(0) + group, tl.sum(keep.to(tl.float32), axis=0))")
    strides = [f"stride_{n}" for n in full_inputs(spec, names)]
    params = [*(f"{n}_ptr" for n in names), "out_ptr", "partial_ptr", "M", "N", *strides,
              "BLOCK_N: tl.constexpr", "ROWS_PER_PROG: tl.constexpr"]
    return ["@triton.jit", signature("loss_rows_kernel", params), *indent(lines)]


def _finish_kernel(spec: KernelSpec) -> list[str]:
    """One program adds the partials in a fixed order: the same result on every run."""
    count = counted(spec)
    loop = ["i = start + tl.arange(0, BLOCK_P)",
            "acc += tl.load(partial_ptr + i, mask=i < P, other=0.0)"]
    if count:
        loop.append("cnt += tl.load(partial_ptr + P + i, mask=i < P, other=0.0)")
    total = "tl.sum(acc, axis=0) / tl.sum(cnt, axis=0)" if count else "tl.sum(acc, axis=0) * scale"
    lines = [*interpreter_ints(["P"]), "acc = tl.zeros([BLOCK_P], dtype=tl.float32)",
             *(["cnt = tl.zeros([BLOCK_P], dtype=tl.float32)"] if count else []),
             "for start in range(0, P, BLOCK_P):", *indent(loop),
             f"tl.store(out_ptr, ({total}).to(out_ptr.dtype.element_ty))"]
    return ["@triton.jit", "def loss_finish_kernel(partial_ptr, out_ptr, P, scale, BLOCK_P: tl.constexpr):",
            *indent(lines)]


def _launch(spec: KernelSpec, config: dict, names: list[str]) -> list[str]:
    red, c = reduction(spec), config
    first = names[0]
    full = [first] if spec.op == "total" else full_inputs(spec, names)
    lines = [f"assert all(t.is_contiguous() for t in ({', '.join([*full, 'out'])},)), 'the loss reads contiguous rows'"]
    if spec.op in ROWWISE:
        strides = ", ".join(f"{n}.stride(0)" for n in full_inputs(spec, names))
        lines += [f"M, N = {first}.shape",
                  f"programs = triton.cdiv(M, {c['ROWS_PER_PROG']})",
                  f"partial = torch.empty({2 if counted(spec) else 1} * programs, dtype=torch.float32, "
                  f"device={first}.device)",
                  f"loss_rows_kernel[(programs,)]({', '.join(names)}, out, partial, M, N, {strides},",
                  f"                               BLOCK_N={c['BLOCK_N']}, ROWS_PER_PROG={c['ROWS_PER_PROG']}, "
                  f"num_warps={c['num_warps']}, num_stages={c['num_stages']})",
                  "count = M"]
    else:
        lines += [f"T, N = {first}.numel(), {first}.shape[-1]",
                  f"programs = max(1, min(triton.cdiv(T, {c['BLOCK']}), sm_count({first}) * {c['WAVES']}))",
                  f"partial = torch.empty(programs, dtype=torch.float32, device={first}.device)",
                  f"loss_kernel[(programs,)]({', '.join(names)}, out, partial, T, N, BLOCK={c['BLOCK']}, INDEX_64=T >= 2**31, "
                  f"num_warps={c['num_warps']}, num_stages={c['num_stages']})",
                  f"count = {first}.shape[0] if {first}.dim() else 1" if red == "batchmean" else "count = T"]
    if red != "none":
        scale = "1.0" if red == "sum" else "1.0 / count"
        lines += ["# pass 2: the partials in a fixed order (deterministic, no atomics)",
                  f"loss_finish_kernel[(1,)](partial, out, programs, {scale}, BLOCK_P={FINISH_BLOCK}, num_warps=4)"]
    return [signature("launch", [*names, "*", "out"]), *indent(lines)]


def render(spec: KernelSpec, config: dict, names: list[str], title: str) -> str:
    """The module: kernels and launch(*inputs named `names`, out)."""
    kernel = _rows_kernel(spec, names) if spec.op in ROWWISE else _flat_kernel(spec, names)
    knobs = " ".join(f"{k}={v}" for k, v in config.items())
    header = [f"# MTMC kernel: {title}", f"# config: {knobs}",
              "# pass 1: each program writes one partial sum of its items; pass 2 adds them in order"]
    parts = ["\n".join(header) + "\nimport os\n" + IMPORTS, INTERPRETED_SOURCE.strip("\n"), "\n".join(kernel)]
    if reduction(spec) != "none":
        parts.append("\n".join(_finish_kernel(spec)))
    parts += [SM_COUNT_SOURCE.strip("\n"), "\n".join(_launch(spec, config, names))]
    return "\n\n\n".join(parts) + "\n"

