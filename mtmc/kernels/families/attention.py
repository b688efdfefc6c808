"""Scaled-dot-product attention as one flash-style Triton kernel.

Spec: op "sdpa".  dims: B (batch), H (heads), L (query length), S (key/value length), E (query
and key head dim), EV (value head dim).  q is [B, H, L, E], k [B, H, S, E], v [B, H, S, EV]; the
output is [B, H, L, EV] in the spec's dtype (F.scaled_dot_product_attention's layout and names).
params:
  scale:  the logits' factor (None: 1/sqrt(E), PyTorch's default);
  mask:   "none" | "causal" (query i sees keys j <= i, PyTorch's is_causal, top-left aligned) |
          "add" (a float tensor added to the scaled logits) | "keep" (a bool tensor, True =
          attend: SDPA's boolean attn_mask) | "fill" (a bool tensor, True = the logit becomes
          `fill`: scores.masked_fill(mask, fill), the hand-written form);
  mask_shape: the mask tensor's shape as 4 entries broadcast against [B, H, L, S]: a dim name
          where it is full, 1 where it broadcasts (default ["L", "S"] padded: [1, 1, "L", "S"]);
  fill:   the value of "fill" masks (default -inf);
  dropout: must be 0 (dropout on the attention weights is random: refused).

How: one program per (query tile of BLOCK_M rows, BLOCK_DV-wide slice of the value dim, batch x
head).  K and V stream through in tiles of BLOCK_N keys with an online softmax (running max and
sum in fp32, exp2 with the scale folded into log2 units); both products run on tensor cores
(tl.dot, fp32 accumulation; fp32 inputs as IEEE or three TF32 products, the PRECISION knob).
Head dims up to 256 keep the query tile in registers; longer ones are walked in BLOCK_E chunks
(and, above BLOCK_DV, each value slice recomputes the logits: a limit, said in the README).
Causal tiles past the diagonal are never visited and only the diagonal tiles pay for the mask;
with a boolean mask, a key tile it masks out wholly (a causal mask written as a tril buffer) is
skipped (its products and softmax; the k and v loads stay where the compiler pipelines them).
Every size and stride comes from the tensors, so q, k, v and the mask are read in place (the
head-split views of a fused QKV projection, a [L, S] mask broadcast over batch and heads).
"""
from __future__ import annotations

import math

from mtmc.kernels.families.elementwise import (
    IMPORTS, INTERPRETED_SOURCE, config_line, indent, interpreter_ints, signature,
)
from mtmc.kernels.family import DTYPE_BYTES, Family, TensorArg, small_dim
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import KernelSpec

MASKS = ("none", "causal", "add", "keep", "fill")
TENSOR_MASKS = ("add", "keep", "fill")
# Longer head dims: the logits' recompute per value slice gets too dear.  At E = 1024 (KernelBench
# L1 97, fp32, H100, 2026-12-06) the best draft took 268 ms against eager's 25.6 (its cuBLAS GEMMs).
MAX_HEAD_DIM = 256
LOG2E = 1.4426950408889634


def attention_spec(q_shape, k_shape, v_shape, dtype: str = "float32", mask: str = "none", mask_shape=None,
                   scale: float | None = None, fill: float | None = None, **params) -> KernelSpec:
    """The spec of F.scaled_dot_product_attention on [B, H, L, E] / [B, H, S, E] / [B, H, S, EV]
    tensors (3-D ones get H = 1); mask_shape: the mask tensor's shape (any shape broadcasting to
    [B, H, L, S]) for tensor masks."""
    q4, k4, v4 = (([s[0], 1, *s[1:]] if len(s) == 3 else list(s)) for s in (q_shape, k_shape, v_shape))
    dims = {"B": q4[0], "H": q4[1], "L": q4[2], "S": k4[2], "E": q4[3], "EV": v4[3]}
    p = {"mask": mask, "scale": None if scale is None else float(scale), **params}
    if mask in TENSOR_MASKS:
        p["mask_shape"] = mask_dims(mask_shape if mask_shape is not None else [dims["L"], dims["S"]], dims)
    if mask == "fill":
        p["fill"] = float("-inf") if fill is None else float(fill)
    return KernelSpec("attention", "sdpa", {k: int(v) for k, v in dims.items()}, dtype, p)


def mask_dims(shape, dims: dict) -> list:
    """A mask's shape as 4 entries against [B, H, L, S]: the dim's name where it is full, 1 where
    it broadcasts; ValueError when it does not broadcast."""
    shape = [int(s) for s in shape]
    if len(shape) > 4:
        raise ValueError(f"a mask of {len(shape)} dims does not broadcast to [B, H, L, S]")
    out = []
    for name, size in zip("B H L S".split(), [1] * (4 - len(shape)) + shape):
        if size == dims[name] and size != 1:
            out.append(name)
        elif size == 1:
            out.append(1)
        else:
            raise ValueError(f"a mask of shape {shape} does not broadcast to [B, H, L, S] = "
                             f"{[dims[k] for k in 'BHLS']}")
    return out


class AttentionFamily(Family):
    name = "attention"
    ops = FAMILY_OPS["attention"]
    tensor_core = True    # both products run on tensor cores (the roofline's peak)

    # -- what ------------------------------------------------------------------------------
    def mask(self, spec: KernelSpec) -> str:
        return spec.params.get("mask", "none")

    def scale(self, spec: KernelSpec) -> float:
        s = spec.params.get("scale")
        return 1.0 / math.sqrt(spec.dims["E"]) if s is None else float(s)

    def describe(self, spec: KernelSpec) -> str:
        d, m = spec.dims, self.mask(spec)
        masks = {"none": "no mask", "causal": "a causal mask", "add": "an additive mask",
                 "keep": "a boolean mask (True attends)", "fill": f"a masked_fill({spec.params.get('fill')}) mask"}
        shape = spec.params.get("mask_shape")
        where = f" of shape [{', '.join(map(str, shape))}]" if m in TENSOR_MASKS and shape else ""
        given = spec.params.get("scale")
        scale = f"scale {given:g}" if given is not None else "scale 1/sqrt(E)"
        return (f"attention: q [{d['B']}, {d['H']}, {d['L']}, {d['E']}], k/v [{d['S']} keys, value dim {d['EV']}] "
                f"in {spec.dtype}, {masks.get(m, m)}{where}, {scale}")

    def validate(self, spec: KernelSpec) -> None:
        super().validate(spec)
        d, p = spec.dims, spec.params
        missing = [k for k in ("B", "H", "L", "S", "E", "EV") if int(d.get(k, 0)) < 1]
        if missing:
            raise ValueError(f"attention needs positive dims B, H, L, S, E, EV; missing or < 1: {', '.join(missing)}")
        for k in ("E", "EV"):
            if d[k] > MAX_HEAD_DIM:
                raise ValueError(f"head dim {k}={d[k]} is above {MAX_HEAD_DIM}; the kernel recomputes the "
                                 "logits per value slice and would be slower than PyTorch")
        if p.get("dropout"):
            raise ValueError(f"attention dropout p={p['dropout']} is random; the kernel computes dropout 0 only")
        if p.get("enable_gqa"):
            raise ValueError("grouped-query attention (enable_gqa) is not in the kernel: k and v need q's heads")
        m = p.get("mask", "none")
        if m not in MASKS:
            raise ValueError(f"attention mask {m!r} is not one of {', '.join(MASKS)}")
        s = p.get("scale")
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s)):
            raise ValueError(f"the attention scale must be a finite number (or None for 1/sqrt(E)); got {s!r}")
        if m in TENSOR_MASKS:
            shape = p.get("mask_shape")
            if not isinstance(shape, list) or len(shape) != 4 or any(
                    v != 1 and v != n for v, n in zip(shape, ("B", "H", "L", "S"))):
                raise ValueError(f"mask_shape must give 4 entries of [B, H, L, S], each the dim's name or 1; got {shape!r}")
        elif "mask_shape" in p:
            raise ValueError(f"a {m!r} attention mask takes no mask tensor (mask_shape)")
        if m == "fill" and not isinstance(p.get("fill"), (int, float)):
            raise ValueError("a 'fill' mask needs the fill value (a number, -inf for masked out)")

    def inputs(self, spec: KernelSpec) -> list[TensorArg]:
        args = [TensorArg("q", ("B", "H", "L", "E")), TensorArg("k", ("B", "H", "S", "E")),
                TensorArg("v", ("B", "H", "S", "EV"))]
        m = self.mask(spec)
        if m in TENSOR_MASKS:
            shape = tuple(spec.params["mask_shape"])
            args.append(TensorArg("mask", shape) if m == "add" else TensorArg("mask", shape, "bool", "mask"))
        return args

    def output(self, spec: KernelSpec) -> TensorArg:
        return TensorArg("out", ("B", "H", "L", "EV"))

    def reference_source(self, spec: KernelSpec) -> str:
        m, p = self.mask(spec), spec.params
        args = [a.name for a in self.inputs(spec)]
        # the default scale from q's own head dim, as the kernel's launch takes it: checks run at
        # cut dims (L1 97: E 1024 checked at 64), where 1/sqrt of the spec's E is wrong for both
        given = spec.params.get("scale") is not None
        scale = repr(self.scale(spec)) if given else "(1.0 / math.sqrt(q.shape[-1]))"
        # PyTorch's own SDPA where it states the op (the eager and compiled baselines run it);
        # a masked_fill with a finite value has no SDPA form and is written out
        # a masked_fill is the hand-written form: softmax over a row masked wholly is NaN there,
        # where SDPA gives 0; each reference says what its own form does
        if m == "fill":
            body = ["s = torch.matmul(q, k.transpose(-2, -1)) * " + scale,
                    f"s = s.masked_fill(mask, {_num(p['fill'])})",
                    "return torch.matmul(torch.softmax(s, dim=-1), v)"]
        else:
            mask = {"none": "None", "causal": "None", "add": "mask", "keep": "mask"}[m]
            body = [f"return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask={mask}, "
                    f"is_causal={m == 'causal'}, scale={scale if given else None})"]
        reference = [signature("reference", args), *indent(body)]
        # The output is a convex mix of v's rows: its error scales with the weights times |v|
        # (rounding of the weights to the input dtype for the second product), plus |out|.
        weights = ["s = torch.matmul(q, k.transpose(-2, -1)) * " + scale]
        if m == "causal":
            weights.append("s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device)"
                           ".tril().logical_not(), float('-inf'))")
        elif m == "add":
            weights.append("s = s + mask")
        elif m == "keep":
            weights.append("s = s.masked_fill(~mask, float('-inf'))")
        elif m == "fill":
            weights.append(f"s = s.masked_fill(mask, {_num(p['fill'])})")
        scale_fn = [signature("error_scale", args), *indent(weights),
                    "    w = torch.softmax(s, dim=-1)",
                    "    return torch.matmul(w, v.abs()) + torch.matmul(w, v).abs()"]
        return "\n".join(reference) + "\n\n\n" + "\n".join(scale_fn) + "\n"

    # -- how -------------------------------------------------------------------------------
    def config_space(self, spec: KernelSpec) -> dict[str, list]:
        e, ev = spec.dims["E"], spec.dims["EV"]
        space = {"BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256],
                 "BLOCK_E": [b for b in (16, 32, 64, 128, 256) if b < _pow2(e)] + [_pow2(e)],
                 "BLOCK_DV": [b for b in (16, 32, 64, 128, 256) if b < _pow2(ev)] + [_pow2(ev)],
                 "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4, 5]}
        if spec.dtype == "float32":
            space["PRECISION"] = ["ieee", "tf32x3"]
        if self._bool_inf_mask(spec):
            space["SKIP_MASKED"] = [False, True]
        return space

    def _bool_inf_mask(self, spec: KernelSpec) -> bool:
        m = self.mask(spec)
        return m == "keep" or (m == "fill" and spec.params.get("fill") == float("-inf"))

    def default_config(self, spec: KernelSpec, hw) -> dict:
        d = spec.dims
        e, ev, fp32 = _pow2(d["E"]), _pow2(d["EV"]), spec.dtype == "float32"
        block_e = e if e <= 256 else 64          # the query tile stays in registers up to 256
        block_dv = min(ev, 256)
        width = max(block_e, block_dv)
        if max(e, ev) > 256:
            # long heads (KernelBench's 1024): one value slice, so q @ k^T is computed once, with
            # the head dim in chunks of 32 and few query rows to hold the [rows, EV] accumulator
            # (swept for sm_90: the largest tiles without spills)
            block_e, block_dv = 32, ev
            bm, bn, warps, stages = (16, 16, 8, 2) if fp32 else (32, 16, 8, 2)
        elif fp32:
            # tf32x3 splits every fp32 tile into TF32 halves, which doubles the registers a tile
            # needs: the largest tiles that compile for sm_90 without spills (swept per head dim)
            if width > 128:   # a [32, 256] query tile spills: the head dim in chunks of 32
                block_e = min(block_e, 32)
            bm, bn, warps, stages = (64, 32, 4, 2) if width <= 64 else (32, 32, 8, 2)
        else:
            # 128 x 64 tiles for head dims <= 64 (FlashAttention-2's choice on Hopper-class GPUs);
            # wider heads hold a [BLOCK_M, BLOCK_DV] fp32 accumulator: 64 rows keep it in registers
            bm, bn = (128 if width <= 64 else 64), (64 if width <= 128 else 32)
            warps, stages = (8 if bm * width >= 128 * 128 else 4), (3 if width <= 128 else 2)
        bm = min(bm, max(16, _pow2(d["L"])))
        bn = min(bn, max(16, _pow2(d["S"])))
        # fewer query tiles than SMs (short sequences, few heads): smaller tiles fill the GPU
        sms = getattr(hw, "sms", 132)
        while bm > 32 and d["B"] * d["H"] * -(-d["L"] // bm) * -(-d["EV"] // block_dv) < sms:
            bm //= 2
        cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_E": block_e, "BLOCK_DV": block_dv,
               "num_warps": warps, "num_stages": stages}
        if fp32:
            cfg["PRECISION"] = "tf32x3" if "tf32" in getattr(hw, "tc_tflops", {}) else "ieee"
        if self._bool_inf_mask(spec):
            # skipping wholly masked key tiles pays off for structured masks: a masked_fill with a
            # tril buffer (the hand-written causal form) is one; an arbitrary boolean mask is not,
            # and the skip's branch costs the tiles it keeps their load pipelining
            cfg["SKIP_MASKED"] = self.mask(spec) == "fill"
            if cfg["SKIP_MASKED"] and fp32:   # the branch's live tiles: 16 query rows compile without spills
                cfg.update(BLOCK_M=16, BLOCK_N=min(cfg["BLOCK_N"], 32), num_warps=8)
        return cfg

    def render(self, spec: KernelSpec, config: dict) -> str:
        space = self.config_space(spec)
        cfg = {**({"PRECISION": "ieee"} if "PRECISION" in space else {}), **{k: config[k] for k in space if k in config}}
        m = self.mask(spec)
        header = (f"# sdpa: out[B, H, L, EV] = softmax(q @ k^T * scale, {m} mask) @ v; {spec.dtype}\n"
                  f"# config: {config_line(cfg)}\n")
        return (header + "import math\nimport os\n" + IMPORTS + "\n\n" + "\n\n\n".join(
            b.strip("\n") for b in (INTERPRETED_SOURCE, self._block(spec, cfg), self._kernel(spec, cfg),
                                    self._launch(spec, cfg))) + "\n")

    def _dot(self, spec: KernelSpec, cfg: dict, a: str, b: str, acc: str) -> str:
        if spec.dtype == "float32":
            return f'tl.dot({a}, {b}, acc={acc}, input_precision="{cfg["PRECISION"]}")'
        return f"tl.dot({a}, {b}, acc={acc})"

    def _block(self, spec: KernelSpec, cfg: dict) -> str:
        """One BLOCK_N-key step of the online softmax (a jit function, so the unmasked and the
        masked loops share it)."""
        m = self.mask(spec)
        bf16 = spec.dtype == "bfloat16"
        params = ["q", "q_rows", "k_base", "v_base", "mask_base", "acc", "m_i", "l_i", "start_n", "offs_m", "mask_m",
                  "offs_d", "mask_d", "S", "E", "qk_scale", "sk_s", "sk_e", "sv_s", "sv_e", "sm_l", "sm_s",
                  *(f"{c}: tl.constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_E", "ONE_E", "MASKED"))]
        upcast = ["if INTERPRETED:  # the interpreter multiplies bf16 bit patterns in tl.dot (triton#11584)",
                  "    qc, kt = qc.to(tl.float32), kt.to(tl.float32)"] if bf16 else []
        head = ["offs_n = start_n + tl.arange(0, BLOCK_N)",
                "mask_n = offs_n < S",
                "offs_e = tl.arange(0, BLOCK_E)"]
        skip = bool(cfg.get("SKIP_MASKED"))
        # out-of-bounds entries of a boolean mask read as masked out, so a tile left wholly masked
        # (above a causal diagonal written as a tril buffer) can be skipped
        other = {"add": "0", "keep": "0", "fill": "1"}.get(m)
        mask_load = ["mv = tl.load(mask_base + offs_m[:, None] * sm_l + offs_n[None, :] * sm_s,",
                     f"             mask=mask_m[:, None] & mask_n[None, :], other={other})"] if other else []
        if skip:
            head += [*mask_load, "attend = mv != 0" if m == "keep" else "attend = mv == 0"]
        k_load = ["if ONE_E:",
                  "    kt = tl.load(k_base + offs_n[None, :] * sk_s + offs_e[:, None] * sk_e,",
                  "                 mask=mask_n[None, :] & (offs_e < E)[:, None], other=0.0)"]
        v_load = ["v = tl.load(v_base + offs_n[:, None] * sv_s + offs_d[None, :] * sv_e,",
                  "            mask=mask_n[:, None] & mask_d[None, :], other=0.0)"]
        if skip:   # k and v at the loop's top level, where the compiler still pipelines them
            head += k_load + v_load
        body = [
            *([] if skip else k_load),
            "# logits of this key tile, fp32 on tensor cores",
            "s = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
            "if ONE_E:  # the whole head dim in one chunk: q stays in registers",
            "    qc = q",
            *indent(upcast),
            "    s = " + self._dot(spec, cfg, "qc", "kt", "s"),
            "else:  # a long head dim in BLOCK_E chunks, q's chunk read again (from L2)",
            *indent(interpreter_ints(["E"])),
            "    for e0 in range(0, E, BLOCK_E):",
            "        mask_e = e0 + offs_e < E",
            "        qc = tl.load(q_rows + (e0 + offs_e)[None, :] * sq_e, mask=mask_m[:, None] & mask_e[None, :], other=0.0)",
            "        kt = tl.load(k_base + offs_n[None, :] * sk_s + (e0 + offs_e)[:, None] * sk_e,",
            "                     mask=mask_n[None, :] & mask_e[:, None], other=0.0)",
            *indent(upcast, 2),
            "        s = " + self._dot(spec, cfg, "qc", "kt", "s"),
            "s = s * qk_scale  # log2 units: exp2 below",
            *([] if skip else mask_load),
        ]
        if skip:
            body.append("s = tl.where(attend, s, float('-inf'))")
        elif m == "keep":
            body.append("s = tl.where(mv != 0, s, float('-inf'))")
        elif m == "add":
            body.append(f"s = s + mv.to(tl.float32) * {LOG2E!r}")
        elif m == "fill":
            body.append(f"s = tl.where(mv != 0, {_num(float(spec.params['fill']) * LOG2E)}, s)")
        body += [
            "if MASKED:  # the tile holding the last keys (or the causal diagonal)",
            "    keep = mask_n[None, :]",
        ]
        if m == "causal":
            body.append("    keep = keep & (offs_n[None, :] <= offs_m[:, None])")
        body += [
            "    s = tl.where(keep, s, float('-inf'))",
            "# online softmax: rescale what was summed so far to the new running max",
            "m_new = tl.maximum(m_i, tl.max(s, 1))",
            "m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)  # a row with nothing seen yet",
            "alpha = tl.math.exp2(m_i - m_safe)",
            "p = tl.math.exp2(s - m_safe[:, None])",
            "l_i = l_i * alpha + tl.sum(p, 1)",
            *([] if skip else v_load),
            "pv = p.to(v.dtype)",
        ]
        if bf16:
            body += ["if INTERPRETED:  # see above",
                     "    pv, v = pv.to(tl.float32), v.to(tl.float32)"]
        body.append("acc = " + self._dot(spec, cfg, "pv", "v", "acc * alpha[:, None]"))
        if skip:   # no key of the tile is attended: no product is done
            body = ["m_new = m_i", "if tl.max(attend.to(tl.int32)) > 0:", *indent(body)]
        else:
            body = ["m_new = m_i", *body]
        body = [*head, *body, "return acc, m_new, l_i"]
        params.insert(params.index("sk_s"), "sq_e")
        return "@triton.jit\n" + signature("attend_block", params) + "\n" + "\n".join(indent(body)) + "\n"

    def _kernel(self, spec: KernelSpec, cfg: dict) -> str:
        m = self.mask(spec)
        params = ["q_ptr", "k_ptr", "v_ptr", "mask_ptr", "out_ptr", "H", "L", "S", "E", "EV", "qk_scale",
                  "sq_b", "sq_h", "sq_l", "sq_e", "sk_b", "sk_h", "sk_s", "sk_e", "sv_b", "sv_h", "sv_s", "sv_e",
                  "sm_b", "sm_h", "sm_l", "sm_s", "so_b", "so_h", "so_l", "so_e",
                  *(f"{c}: tl.constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_E", "BLOCK_DV", "ONE_E"))]
        call = ("attend_block(q, q_rows, k_base, v_base, mask_base, acc, m_i, l_i, start_n, offs_m, mask_m, offs_d, "
                "mask_d, S, E, qk_scale, sq_e, sk_s, sk_e, sv_s, sv_e, sm_l, sm_s, BLOCK_M, BLOCK_N, BLOCK_E, ONE_E, {})")
        if m == "causal":
            bounds = ["# causal: keys past the tile's last query are never visited; tiles left of the",
                      "# diagonal need no mask",
                      "hi = tl.minimum(S, off_m + BLOCK_M)",
                      "lo = tl.minimum(off_m // BLOCK_N * BLOCK_N, S // BLOCK_N * BLOCK_N)"]
        else:
            bounds = ["hi = S", "lo = S // BLOCK_N * BLOCK_N  # whole key tiles need no bounds mask"]
        body = [
            "# program -> (query tile, value slice, batch x head); query tiles vary fastest so the",
            "# programs running together share k and v from L2",
            "pid = tl.program_id(0)",
            "tiles_m = (L + BLOCK_M - 1) // BLOCK_M",
            "slices = (EV + BLOCK_DV - 1) // BLOCK_DV",
            "tile_m = pid % tiles_m",
            *(["tile_m = tiles_m - 1 - tile_m  # the longest causal rows start first"] if m == "causal" else []),
            "dv = (pid // tiles_m) % slices",
            "bh = pid // (tiles_m * slices)",
            "b = (bh // H).to(tl.int64)",
            "h = (bh % H).to(tl.int64)",
            "off_m = tile_m * BLOCK_M",
            "offs_m = off_m + tl.arange(0, BLOCK_M)",
            "mask_m = offs_m < L",
            "offs_d = dv * BLOCK_DV + tl.arange(0, BLOCK_DV)",
            "mask_d = offs_d < EV",
            "# the (batch, head) corners in 64-bit: big tensors pass 2**31 elements",
            "q_rows = q_ptr + b * sq_b + h * sq_h + offs_m[:, None] * sq_l",
            "k_base = k_ptr + b * sk_b + h * sk_h",
            "v_base = v_ptr + b * sv_b + h * sv_h",
            "mask_base = mask_ptr + b * sm_b + h * sm_h",
            "q = tl.zeros((BLOCK_M, BLOCK_E), dtype=q_ptr.dtype.element_ty)",
            "if ONE_E:",
            "    offs_e = tl.arange(0, BLOCK_E)",
            "    q = tl.load(q_rows + offs_e[None, :] * sq_e, mask=mask_m[:, None] & (offs_e < E)[None, :], other=0.0)",
            "m_i = tl.full((BLOCK_M,), float('-inf'), dtype=tl.float32)",
            "l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)",
            "acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)",
            *bounds,
            *interpreter_ints(["lo", "hi"]),
            "for start_n in range(0, lo, BLOCK_N):",
            "    acc, m_i, l_i = " + call.format("False"),
            "for start_n in range(lo, hi, BLOCK_N):",
            "    acc, m_i, l_i = " + call.format("True"),
            *(["out = acc / l_i[:, None]  # a row masked wholly: NaN, as softmax of -inf gives"] if m == "fill" else
              ["out = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)  # a row masked wholly: 0, as SDPA gives"]),
            "o_ptrs = out_ptr + b * so_b + h * so_h + offs_m[:, None] * so_l + offs_d[None, :] * so_e",
            "tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])",
        ]
        return "@triton.jit\n" + signature("attention_kernel", params) + "\n" + "\n".join(indent(body)) + "\n"

    def _launch(self, spec: KernelSpec, cfg: dict) -> str:
        names = [a.name for a in self.inputs(spec)]
        tensor_mask = self.mask(spec) in TENSOR_MASKS
        given = spec.params.get("scale")
        lines = [
            "# 3-D [B, L, E] tensors are one head; every size and stride comes from the tensors",
            "q4, k4, v4, o4 = (t.unsqueeze(1) if t.dim() == 3 else t for t in (q, k, v, out))",
            "B, H, L, E = q4.shape",
            "S, EV = k4.shape[2], v4.shape[3]",
            f"scale = {'1.0 / math.sqrt(E)' if given is None else repr(float(given))}",
        ]
        if tensor_mask:
            lines += ["m4 = mask.expand(B, H, L, S)  # broadcast dims get stride 0: read in place, never copied",
                      "sm = m4.stride()"]
        else:
            lines += ["m4, sm = q4, (0, 0, 0, 0)  # no mask tensor: a placeholder pointer, never read"]
        lines += [
            f"BLOCK_M, BLOCK_DV = {cfg['BLOCK_M']}, {cfg['BLOCK_DV']}",
            "programs = triton.cdiv(L, BLOCK_M) * triton.cdiv(EV, BLOCK_DV) * B * H",
            "if programs == 0:",
            "    return",
            f"attention_kernel[(programs,)](q4, k4, v4, m4, o4, H, L, S, E, EV, scale * {LOG2E!r},",
            "                               *q4.stride(), *k4.stride(), *v4.stride(), *sm, *o4.stride(),",
            f"                               BLOCK_M=BLOCK_M, BLOCK_N={cfg['BLOCK_N']}, BLOCK_E={cfg['BLOCK_E']},",
            f"                               BLOCK_DV=BLOCK_DV, ONE_E=E <= {cfg['BLOCK_E']},",
            f"                               num_warps={cfg['num_warps']}, num_stages={cfg['num_stages']})",
        ]
        return signature("launch", [*names, "*", "out"]) + "\n" + "\n".join(indent(lines)) + "\n"

    # -- cost and checking -----------------------------------------------------------------
    def _pairs(self, spec: KernelSpec) -> float:
        """Query-key pairs computed: all of them, or the causal triangle."""
        d = spec.dims
        if self.mask(spec) == "causal":
            seen = sum(min(i + 1, d["S"]) for i in range(d["L"])) if d["L"] <= 1 << 16 else d["L"] * d["S"] / 2
            return float(d["B"] * d["H"] * seen)
        return float(d["B"] * d["H"] * d["L"] * d["S"])

    def work(self, spec: KernelSpec) -> tuple[float, float]:
        d = spec.dims
        flops = self._pairs(spec) * 2 * (d["E"] + d["EV"])
        return flops, float(self.tensor_bytes(spec))

    def programs(self, spec: KernelSpec, config: dict) -> int:
        d = spec.dims
        return d["B"] * d["H"] * -(-d["L"] // int(config["BLOCK_M"])) * -(-d["EV"] // int(config["BLOCK_DV"]))

    def steps(self, spec: KernelSpec, config: dict) -> int:
        """Key tiles one program walks (half of them under a causal mask), times the head-dim
        chunks of each: the roofline model's loop length."""
        d = spec.dims
        tiles = -(-d["S"] // int(config["BLOCK_N"]))
        if self.mask(spec) == "causal":
            tiles = max(1, tiles // 2)
        chunks = 1 if d["E"] <= int(config["BLOCK_E"]) else -(-d["E"] // int(config["BLOCK_E"]))
        return tiles * chunks

    def traffic(self, spec: KernelSpec, config: dict) -> float:
        """Bytes moved: q and out once; k and v once per query tile running apart (L2 serves
        the tiles of one head that run together, about one wave of programs)."""
        d, elem = spec.dims, DTYPE_BYTES[spec.dtype]
        slices = -(-d["EV"] // int(config["BLOCK_DV"]))
        kv = d["B"] * d["H"] * d["S"] * (d["E"] * slices + d["EV"]) * elem
        return float(self.tensor_bytes(spec) - kv / slices + kv)

    def check_dims(self, spec: KernelSpec, config: dict) -> dict[str, int]:
        d = spec.dims
        bm, bn = int(config["BLOCK_M"]), int(config["BLOCK_N"])
        return {"B": min(d["B"], 2), "H": min(d["H"], 2), "L": small_dim(d["L"], bm), "S": small_dim(d["S"], bn),
                "E": small_dim(d["E"], int(config["BLOCK_E"])), "EV": small_dim(d["EV"], int(config["BLOCK_DV"]))}


def _num(v: float) -> str:
    """A float as source text (repr gives a bare `inf`)."""
    return repr(float(v)) if math.isfinite(v) else f"float('{v}')"


def _pow2(n: int) -> int:
    return max(16, 1 << max(int(n) - 1, 0).bit_length())


FAMILY = AttentionFamily()
