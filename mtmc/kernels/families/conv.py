"""Convolutions (1D/2D/3D, plain and transposed) as implicit-GEMM Triton kernels, with a fused
pointwise epilogue.

Spec: op "conv1d" | "conv2d" | "conv3d" | "conv_transpose1d" | "conv_transpose2d" |
"conv_transpose3d".  dims: N (batch), C_in, C_out, the input's spatial sizes (L; H, W; D, H, W)
and the output's (OL; OH, OW; OD, OH, OW), which validate() checks against the formula.
params (per spatial dim, outermost first; `conv_spec` builds them from PyTorch-style arguments):
  kernel [k...], stride [s...], padding [[lo, hi]...] (asymmetric only for plain convs, as an
  F.pad before the conv gives it), dilation [d...], groups (int), output_padding [op...]
  (transposed only), epilogue (a pointwise chain on the fp32 result), allow_tf32 (fp32 only:
  the user accepts TF32 products).
x is [N, C_in, *S]; w is [C_out, C_in/groups, *k] ([C_in, C_out/groups, *k] when transposed),
as nn.Conv*d / nn.ConvTranspose*d hold them; the output is [N, C_out, *OS], contiguous.
The epilogue's operands follow x and w in pointwise.operands() order: a "bias" step reads a
[C_out] vector (the conv's own bias is such a first step), a two-operand step marked
{"channel": true} reads a [C_out] vector too (a [C, 1, 1] parameter), one marked {"scalar": true}
one value (a 0-d parameter, loaded once), any other two-operand step a full [N, C_out, *OS]
tensor (a residual).

How (the template in _conv_render): the GEMM is M = output pixels (N x OS) by N = output
channels of one group, K = input channels of the group x kernel taps; a group axis in the grid
serves grouped convs.  ALGO picks the K walk: "taps" (taps outer, BLOCK_K channels inner: per
tap one row mask, for many channels), "flat" (the flattened (channel, tap) index in BLOCK_K
chunks: few channels, e.g. an RGB first layer) or "direct" (no GEMM: a multiply-add per output
channel over its group's few input channels, for depthwise convs).  A transposed conv is a
gather: output o reads input (o + pad - k*dil) / stride where that divides; the grid has one
axis per stride phase (o mod stride), so each program visits only its phase's valid taps and no
zero-inserted input is ever made.
"""
from __future__ import annotations

import math

from mtmc.kernels import pointwise
from mtmc.kernels.families._conv_render import render
from mtmc.kernels.families.elementwise import indent, operand_steps, signature, step_lines
from mtmc.kernels.family import DTYPE_BYTES, Family, TensorArg, elements, small_dim
from mtmc.kernels.spec import TF32_ERROR_SCALE, KernelSpec
from mtmc.kernels.families._conv_geometry import (  # noqa: F401
    SPATIAL, is_channel_step, is_transposed, out_names, rank, validate_channel_epilogue,
)

OPS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
ALGOS = ("taps", "flat", "direct")
DIRECT_MAX_CHANNELS = 8     # "direct" is legal up to this many input channels per group


PADDING_MODES = ("zeros", "reflect", "replicate", "circular")

def out_size(size: int, k: int, s: int, lo: int, hi: int, d: int, op_pad: int, transposed: bool) -> int:
    """One spatial output size, as PyTorch computes it."""
    if transposed:
        return (size - 1) * s - lo - hi + d * (k - 1) + op_pad + 1
    return (size + lo + hi - d * (k - 1) - 1) // s + 1


def _per_dim(v, r: int, what: str) -> list:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v] * r
    v = list(v)
    if len(v) != r:
        raise ValueError(f"{what} needs {r} value(s), one per spatial dim; got {v}")
    return v


def _padding(p, r: int) -> list[list[int]]:
    """int, [p per dim] or [[lo, hi] per dim] -> [[lo, hi] per dim]."""
    return [[int(x), int(x)] if isinstance(x, int) else [int(x[0]), int(x[1])] for x in _per_dim(p, r, "padding")]


def conv_spec(op: str, x_shape, out_channels: int, kernel, stride=1, padding=0, dilation=1, groups: int = 1,
              output_padding=0, bias: bool = False, epilogue=(), dtype: str = "float32", **params) -> KernelSpec:
    """The spec of a PyTorch-style conv call (bias=True: the conv's bias as the first epilogue step)."""
    r = rank(op)
    if len(x_shape) != r + 2:
        raise ValueError(f"{op} takes a [N, C, {', '.join(SPATIAL[r])}] input; got shape {list(x_shape)}")
    p = {"kernel": [int(k) for k in _per_dim(kernel, r, "kernel")],
         "stride": [int(s) for s in _per_dim(stride, r, "stride")],
         "padding": _padding(padding, r), "dilation": [int(d) for d in _per_dim(dilation, r, "dilation")],
         "groups": int(groups)}
    if is_transposed(op):
        p["output_padding"] = [int(o) for o in _per_dim(output_padding, r, "output_padding")]
    epi = ([{"op": "bias"}] if bias else []) + [dict(s) for s in epilogue]
    if epi:
        p["epilogue"] = epi
    p.update(params)
    dims = {"N": int(x_shape[0]), "C_in": int(x_shape[1]), "C_out": int(out_channels)}
    dims.update({name: int(v) for name, v in zip(SPATIAL[r], x_shape[2:])})
    dims.update(output_dims(op, dims, p))
    return KernelSpec("conv", op, dims, dtype, p)


def output_dims(op: str, dims: dict, params: dict) -> dict[str, int]:
    """The output's spatial dims for input dims `dims` (the formula validate() checks)."""
    r, t = rank(op), is_transposed(op)
    ops = params.get("output_padding") or [0] * r
    return {o: out_size(dims[i], k, s, lo, hi, d, opad, t) for o, i, k, s, (lo, hi), d, opad in zip(
        out_names(op), SPATIAL[r], params["kernel"], params["stride"], params["padding"], params["dilation"], ops)}


def padding_mode(spec: KernelSpec) -> str:
    return spec.params.get("padding_mode", "zeros")


def check_padding_mode(spec: KernelSpec) -> None:
    """nn.Conv's padding_mode: the kernel remaps out-of-range input indices (reflect, replicate,
    circular) in its gather instead of reading a padded copy; PyTorch's limits on the pad apply."""
    mode = padding_mode(spec)
    if mode not in PADDING_MODES:
        raise ValueError(f"padding_mode must be one of {', '.join(PADDING_MODES)}; got {mode!r}")
    if mode == "zeros":
        return
    if is_transposed(spec.op):
        raise ValueError(f"padding_mode {mode!r}: transposed convs pad with zeros only (as in PyTorch)")
    for name, (lo, hi) in zip(SPATIAL[rank(spec.op)], spec.params["padding"]):
        size = spec.dims[name]
        if (mode == "reflect" and max(lo, hi) >= size) or (mode == "circular" and max(lo, hi) > size):
            raise ValueError(f"{mode} padding of {max(lo, hi)} needs a larger input dim {name} (it is {size})")


class ConvFamily(Family):
    name = "conv"
    ops = OPS

    # -- what ------------------------------------------------------------------------------
    def epilogue(self, spec: KernelSpec) -> list[dict]:
        return list(spec.params.get("epilogue") or [])

    def groups(self, spec: KernelSpec) -> int:
        return int(spec.params.get("groups", 1))

    def per_group(self, spec: KernelSpec, dims: dict | None = None) -> tuple[int, int]:
        """(input channels, output channels) of one group."""
        d, g = dims or spec.dims, self.groups(spec)
        return d["C_in"] // g, d["C_out"] // g

    def taps(self, spec: KernelSpec) -> int:
        return math.prod(spec.params["kernel"])

    def describe(self, spec: KernelSpec) -> str:
        d, p, r = spec.dims, spec.params, rank(spec.op)
        x = " x ".join(str(d[k]) for k in ("N", "C_in", *SPATIAL[r]))
        o = " x ".join(str(d[k]) for k in ("N", "C_out", *out_names(spec.op)))
        words = [f"kernel {'x'.join(map(str, p['kernel']))}"]
        for key in ("stride", "dilation", "output_padding"):
            if any(v != (0 if key == "output_padding" else 1) for v in p.get(key, [])):
                words.append(f"{key.replace('_', ' ')} {'x'.join(map(str, p[key]))}")
        pads = p["padding"]
        if any(lo or hi for lo, hi in pads):
            words.append("padding " + ("x".join(str(lo) for lo, _ in pads) if all(lo == hi for lo, hi in pads)
                                       else " ".join(f"{lo}/{hi}" for lo, hi in pads)))
        if padding_mode(spec) != "zeros":
            words.append(f"{padding_mode(spec)} padding")
        g = self.groups(spec)
        if g > 1:
            words.append("depthwise" if g == d["C_in"] == d["C_out"] else f"{g} groups")
        epi = self.epilogue(spec)
        then = f", then {pointwise.describe_chain(epi)}" if epi else ""
        return f"{spec.op}: [{x}] -> [{o}] in {spec.dtype}, {', '.join(words)}{then}"

    def validate(self, spec: KernelSpec) -> None:
        super().validate(spec)
        r, p, d = rank(spec.op), spec.params, spec.dims
        need = ("N", "C_in", "C_out", *SPATIAL[r], *out_names(spec.op))
        missing = [k for k in need if int(d.get(k, 0)) < 1]
        if missing:
            raise ValueError(f"{spec.op} needs positive dims {', '.join(need)}; missing or < 1: {', '.join(missing)}")
        for key in ("kernel", "stride", "dilation"):
            v = p.get(key)
            if not isinstance(v, list) or len(v) != r or not all(isinstance(x, int) and x >= 1 for x in v):
                raise ValueError(f"{spec.op} needs '{key}': {r} positive int(s); got {v!r}")
        pads = p.get("padding")
        if not isinstance(pads, list) or len(pads) != r or not all(
                isinstance(x, list) and len(x) == 2 and all(isinstance(y, int) and y >= 0 for y in x) for x in pads):
            raise ValueError(f"{spec.op} needs 'padding': {r} [lo, hi] pairs of ints >= 0; got {pads!r}")
        g = p.get("groups", 1)
        if not isinstance(g, int) or g < 1 or d["C_in"] % g or d["C_out"] % g:
            raise ValueError(f"groups={g!r} must be a positive int dividing C_in={d['C_in']} and C_out={d['C_out']}")
        if is_transposed(spec.op):
            if any(lo != hi for lo, hi in pads):
                raise ValueError("a transposed conv takes symmetric padding (PyTorch's); got " + str(pads))
            opad = p.get("output_padding", [0] * r)
            if not isinstance(opad, list) or len(opad) != r or not all(isinstance(x, int) and x >= 0 for x in opad):
                raise ValueError(f"output_padding needs {r} int(s) >= 0; got {opad!r}")
            for o, s, dil in zip(opad, p["stride"], p["dilation"]):
                if o >= max(s, dil):
                    raise ValueError(f"output_padding {o} must be smaller than the stride ({s}) or the dilation ({dil})")
        elif "output_padding" in p:
            raise ValueError("output_padding is for transposed convs only")
        check_padding_mode(spec)
        want = output_dims(spec.op, d, p)
        wrong = {k: v for k, v in want.items() if d[k] != v}
        if wrong:
            got = {k: d[k] for k in wrong}
            raise ValueError(f"output dims {got} do not follow from the input and params; they would be {wrong}")
        epi = validate_channel_epilogue(p, "conv")
        if p.get("allow_tf32") and spec.dtype != "float32":
            raise ValueError("allow_tf32 is for float32 convs")

    def inputs(self, spec: KernelSpec) -> list[TensorArg]:
        r, g, k = rank(spec.op), self.groups(spec), tuple(spec.params["kernel"])
        w = ("C_in", "C_out/G", *k) if is_transposed(spec.op) else ("C_out", "C_in/G", *k)
        args = [TensorArg("x", ("N", "C_in", *SPATIAL[r])), TensorArg("w", w, groups=g)]
        epi = self.epilogue(spec)
        for i, name, _ in operand_steps(epi):
            shape = ("C_out",) if is_channel_step(epi[i]) else pointwise.operand_shape(
                epi[i], full=("N", "C_out", *out_names(spec.op)))
            args.append(TensorArg(name, shape, **pointwise.operand_arg(epi[i])))
        return args

    def output(self, spec: KernelSpec) -> TensorArg:
        return TensorArg("out", ("N", "C_out", *out_names(spec.op)))

    def torch_call(self, spec: KernelSpec, x: str, w: str, target: str) -> list[str]:
        """Lines setting `target` to the conv of x by w (no bias) with torch.nn.functional."""
        p, r = spec.params, rank(spec.op)
        pads = p["padding"]
        tup = lambda v: "(" + ", ".join(map(str, v)) + ("," if len(v) == 1 else "") + ")"  # noqa: E731
        groups = self.groups(spec)
        if is_transposed(spec.op):
            return [f"{target} = torch.nn.functional.{spec.op}({x}, {w}, None, stride={tup(p['stride'])}, "
                    f"padding={tup([lo for lo, _ in pads])}, output_padding={tup(p['output_padding'])}, "
                    f"groups={groups}, dilation={tup(p['dilation'])})"]
        lines, mode = [], padding_mode(spec)
        if any(lo != hi for lo, hi in pads) or mode != "zeros":   # pad first (F.pad lists the last dim first)
            flat = [v for lo, hi in reversed(pads) for v in (lo, hi)]
            how = "" if mode == "zeros" else f", mode={mode!r}"
            lines.append(f"{target} = torch.nn.functional.pad({x}, {tup(flat)}{how})")
            x, pads = target, [[0, 0]] * r
        lines.append(f"{target} = torch.nn.functional.{spec.op}({x}, {w}, None, stride={tup(p['stride'])}, "
                     f"padding={tup([lo for lo, _ in pads])}, dilation={tup(p['dilation'])}, groups={groups})")
        return lines

    def reference_source(self, spec: KernelSpec) -> str:
        epi = self.epilogue(spec)
        names = {i: name for i, name, _ in operand_steps(epi)}
        args = [a.name for a in self.inputs(spec)]
        ones = ", 1" * rank(spec.op)
        # [C_out] operands broadcast over the channel dim of [N, C_out, *OS]
        views = [f"    {names[i]} = {names[i]}.reshape(-1{ones})" for i in names if is_channel_step(epi[i])]
        epi_lines = step_lines(epi, "x", names, pointwise.torch_expr)
        reference = [signature("reference", args), *views, *indent(self.torch_call(spec, "x", "w", "x")),
                     *indent(epi_lines), "    return x"]
        # The error of a K-long fp32 sum scales with sum |x||w|: the same conv of |x| by |w|; each
        # epilogue step then scales it by its local slope; |out| covers the final rounding.
        scale = [signature("error_scale", args), *views, *indent(self.torch_call(spec, "x.abs()", "w.abs()", "s")),
                 *indent(self.torch_call(spec, "x", "w", "x"))]
        for i, (step, line) in enumerate(zip(epi, epi_lines)):
            gain = pointwise.error_gain(step, names.get(i))
            if gain:
                scale.append("    s = " + gain)
            scale.append("    " + line)
        factor = f" * {TF32_ERROR_SCALE}" if spec.params.get("allow_tf32") else ""
        scale.append(f"    return (s + x.abs()){factor}")
        return "\n".join(reference) + "\n\n\n" + "\n".join(scale) + "\n"

    # -- how -------------------------------------------------------------------------------
    def direct_legal(self, spec: KernelSpec) -> bool:
        return self.per_group(spec)[0] <= DIRECT_MAX_CHANNELS

    def config_space(self, spec: KernelSpec) -> dict[str, list]:
        space = {"ALGO": [a for a in ALGOS if a != "direct" or self.direct_legal(spec)],
                 "BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256],
                 "BLOCK_K": [16, 32, 64, 128], "GROUP_M": [1, 2, 4, 8, 16], "SPLIT_K": [1, 2, 4, 8, 16],
                 "LAYOUT": ["nchw", "channels_last"], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4, 5]}
        if spec.dtype == "float32":
            space["PRECISION"] = ["ieee", "tf32x3"] + (["tf32"] if spec.params.get("allow_tf32") else [])
        return space

    def default_config(self, spec: KernelSpec, hw) -> dict:
        d = spec.dims
        ci, co = self.per_group(spec)
        taps = self.taps(spec)
        m = d["N"] * math.prod(d[o] for o in out_names(spec.op))
        fp32 = spec.dtype == "float32"

        def tile(size: int, lo: int = 16, hi: int = 128) -> int:
            return max(lo, min(hi, 1 << max(size - 1, 1).bit_length()))

        if self.direct_legal(spec) and (ci <= 2 or co <= 2):
            algo = "direct"    # depthwise-like: a GEMM tile would be mostly padding
        elif taps == 1:
            algo = "flat"      # 1x1: measured on the H200 (L1 task 87) 3.7x faster than "taps" in fp32, 1.2x in fp16
        elif ci % 16 == 0 or ci >= 64:
            algo = "taps"
        else:
            algo = "flat"      # few channels: the flattened (channel, tap) K keeps tiles full
        # 128 x 64 tiles, BLOCK_K 32, 8 warps: the largest that compile without spills for sm_90
        # in fp32 and fp16 (an [M, N] output tile needs a 64-bit address per element: 128 x 128
        # with 4 warps spills); K depth and channels cap them for small problems.
        kdepth = ci if algo == "taps" else ci * taps
        # the flattened walk decodes a (channel, tap) pair per element of the [BLOCK_M, BLOCK_K]
        # tile: fp32 keeps that tile at 16 deep to stay within registers (a 1x1 conv decodes
        # nothing); fp16/bf16 "taps" tiles read 64 channels a step where there are that many
        # (H200, L1 task 55: 1.11x)
        deep = not fp32 and algo == "taps" and ci >= 64
        bk = min(16 if algo == "flat" and fp32 and taps > 1 else (64 if deep else 32), tile(kdepth, 16, 64 if deep else 32))
        cols = d["C_out"] if algo == "direct" else co
        bn = tile(cols, 16, 64)
        # a transposed conv with strides keeps each stride phase's taps and indices in registers:
        # 64 rows leave room for them
        phased = is_transposed(spec.op) and any(st > 1 for st in spec.params["stride"])
        bm = min(64 if phased else 128, tile(m, 16, 128))
        programs = -(-m // bm) * -(-cols // bn) * (1 if algo == "direct" else self.groups(spec))
        iters = (-(-ci // bk) * taps) if algo == "taps" else (-(-ci * taps // bk) if algo == "flat" else ci * taps)
        # Few tiles but a long K walk: split it until about one program per SM, >= 4 steps each.
        sms = getattr(hw, "sms", 132)
        split = 1
        while split < 16 and programs * split * 2 <= sms and iters >= split * 2 * 4:
            split *= 2
        # "taps" tiles read BLOCK_K channels per pixel: channels-last makes them contiguous, so loads
        # vectorize and pipeline (asynchronous copies need 4+ contiguous bytes; NCHW rows wrap at
        # image edges, so the compiler cannot prove them contiguous); one copy of x pays it.  On the
        # H200 it made fp32 tf32x3 convs 2-3.3x faster too (L1 tasks 55, 57)
        layout = "channels_last" if algo == "taps" else "nchw"
        # 8 warps for big tiles, except where 4 measured faster on the H200: fp16/bf16 "taps" (L1
        # tasks 55, 57: 1.11-1.13x) and direct convs of a few channels (depthwise 83, 128 x 16
        # tiles: 1.25-1.56x); wider fp32 direct tiles and strided transposed ones spill with 4
        big = bm >= 128 or bm * bn >= 64 * 64
        four = (algo == "taps" and not fp32 and not phased) or (algo == "direct" and bm * bn <= 128 * 16)
        warps = 8 if big and not four else 4
        cfg = {"ALGO": algo, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8 if -(-m // bm) > 1 else 1,
               "SPLIT_K": split, "LAYOUT": layout, "num_warps": warps,
               "num_stages": 3}
        if fp32:
            # tf32x3 keeps fp32 accuracy at tensor-core speed (the matmul family's default too):
            # measured on the H200, IEEE FMAs made a 3x3 conv 1.36x slower (L1 task 59) and ran at
            # ~13 TFLOP/s on task 55; direct convs use no tl.dot, so their precision is moot
            tc = algo != "direct" and "tf32" in getattr(hw, "tc_tflops", {})
            # one TF32 product where the user allowed it (a third of tf32x3's tensor work)
            cfg["PRECISION"] = ("tf32" if spec.params.get("allow_tf32") else "tf32x3") if tc else "ieee"
        return cfg

    def render(self, spec: KernelSpec, config: dict) -> str:
        cfg = {k: config[k] for k in self.config_space(spec)}
        return render(self, spec, cfg)

    # -- cost and checking -----------------------------------------------------------------
    def gemm_dims(self, spec: KernelSpec) -> dict[str, int]:
        """The implicit GEMM per group: M output pixels, N output channels, K reduction depth;
        B is the number of groups (for the roofline model's tile accounting)."""
        d = spec.dims
        ci, co = self.per_group(spec)
        m = d["N"] * math.prod(d[o] for o in out_names(spec.op))
        k = ci * self.taps(spec)
        if is_transposed(spec.op):   # each input pixel meets every tap: the same MACs, counted per output
            k = -(-(d["N"] * ci * math.prod(d[s] for s in SPATIAL[rank(spec.op)]) * self.taps(spec)) // m)
        return {"B": self.groups(spec), "M": m, "N": co, "K": k}

    def programs(self, spec: KernelSpec, config: dict) -> int:
        """The launch grid: tiles of each stride phase x phases x groups (GEMM) x K splits."""
        d, p = spec.dims, spec.params
        phased = is_transposed(spec.op)
        rows, phases = d["N"], 1
        for o, s in zip(out_names(spec.op), p["stride"]):
            rows *= -(-d[o] // s) if phased else d[o]
            phases *= s if phased else 1
        direct = config.get("ALGO") == "direct"
        cols = d["C_out"] if direct else self.per_group(spec)[1]
        tiles = -(-rows // int(config["BLOCK_M"])) * -(-cols // int(config["BLOCK_N"]))
        return tiles * phases * (1 if direct else self.groups(spec)) * int(config.get("SPLIT_K", 1))

    def work(self, spec: KernelSpec) -> tuple[float, float]:
        d = spec.dims
        r = rank(spec.op)
        ci, co = self.per_group(spec)
        taps = self.taps(spec)
        out_numel = d["N"] * d["C_out"] * math.prod(d[o] for o in out_names(spec.op))
        x_numel = d["N"] * d["C_in"] * math.prod(d[s] for s in SPATIAL[r])
        if is_transposed(spec.op):   # every input element meets every tap of its group's outputs
            macs = x_numel * co * taps
        else:
            macs = out_numel * ci * taps
        epi = self.epilogue(spec)
        w_numel = d["C_out"] * ci * taps
        elems = x_numel + w_numel + out_numel + elements(self.inputs(spec)[2:], d)
        return float(2 * macs + out_numel * len(epi)), float(elems * DTYPE_BYTES[spec.dtype])

    def check_dims(self, spec: KernelSpec, config: dict) -> dict[str, int]:
        """Batch <= 2; a group's channels cut to two BLOCK_K (BLOCK_N) chunks plus the real tail;
        spatial sizes cut so the output rows fill a few BLOCK_M tiles, keeping the stride's
        remainder (the last window's position); the groups stay (the reference needs them)."""
        d, p, g = spec.dims, spec.params, self.groups(spec)
        algo, bk, bn, bm = config["ALGO"], int(config["BLOCK_K"]), int(config["BLOCK_N"]), int(config["BLOCK_M"])
        ci, co = self.per_group(spec)
        taps = self.taps(spec)
        if algo == "direct":
            ci_s, co_s = min(ci, 3), (min(co, 2) if g > 1 else small_dim(co, bn))
        else:
            ci_s = small_dim(ci, bk) if algo == "taps" else small_dim(ci, max(1, -(-bk // taps)))
            co_s = small_dim(co, bn)
        n = min(d["N"], 2)
        rows = min(int(config.get("GROUP_M", 1)) + 1, 3)
        phases = math.prod(p["stride"]) if is_transposed(spec.op) else 1
        target = max(1, -(-rows * bm * phases // n))   # output pixels per image
        r = rank(spec.op)
        dims = {"N": n, "C_in": g * ci_s, "C_out": g * co_s}
        opads = p.get("output_padding") or [0] * r
        for i, (s_name, k, s, (lo, hi), dil, opad) in enumerate(zip(SPATIAL[r], p["kernel"], p["stride"], p["padding"],
                                                                   p["dilation"], opads)):
            per_dim = max(2, round(target ** (1.0 / (r - i))))
            t = is_transposed(spec.op)
            dims[s_name] = _small_input(d[s_name], per_dim, s,
                                        lambda n, k=k, s=s, lo=lo, hi=hi, dil=dil, opad=opad: out_size(n, k, s, lo, hi, dil, opad, t))
            made = out_size(dims[s_name], k, s, lo, hi, dil, opad, is_transposed(spec.op))
            target = max(1, -(-target // max(1, made)))
        dims.update(output_dims(spec.op, dims, p))
        return dims


def _small_input(size: int, out_target: int, s: int, out_of) -> int:
    """The least input size <= `size` whose output (out_of(input size)) reaches `out_target` (or
    the real size), with the same remainder mod the stride s as the real size.  The pool family
    uses it too."""
    if out_of(size) <= out_target:
        return size
    small = 1
    while out_of(small) < max(1, out_target):
        small += 1
    small += (size - small) % s
    return min(size, small)


FAMILY = ConvFamily()
