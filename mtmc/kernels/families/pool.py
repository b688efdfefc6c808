"""Pooling (max, average, adaptive max / average; 1D/2D/3D) with a fused pointwise epilogue.

Spec: op "{max,avg,adaptive_max,adaptive_avg}_pool{1,2,3}d".  dims: N (batch), C, the input's
spatial sizes (L; H, W; D, H, W) and the output's (OL; OH, OW; OD, OH, OW).  x is [N, C, *S],
read through its strides (no copy); the output is [N, C, *OS], contiguous.
params (`pool_spec` builds them from PyTorch-style arguments):
  fixed windows: kernel [k...], stride [s...], padding [p...] (symmetric, <= k / 2, as PyTorch
  pads), ceil_mode; max only: dilation [d...]; avg only: count_include_pad (default True),
  divisor_override (int);
  adaptive: nothing (the output dims are the output_size; output o of a dim of size I pools
  [floor(o I / O), ceil((o + 1) I / O)));
  max and adaptive max: indices (True: the output is the int64 flat index of each window's max
  within its input plane, exactly as PyTorch's return_indices gives it);
  prologue: operand-free pointwise steps on each input tap before pooling (padding is filled
  after them: max pads f(x) with -inf, avg with 0);
  epilogue: a pointwise chain on the fp32 result (pointwise vocabulary); its operands follow x
  in pointwise.operands() order: a two-operand step marked {"channel": true} (or "bias") reads a
  [C] vector, one marked {"scalar": true} one value (loaded once), any other one a full
  [N, C, *OS] tensor.
Semantics are PyTorch's: max pads with -inf (padded taps never win) and propagates NaN, the
first maximum in scan order wins ties; avg divides by the window clipped to the padded input
(count_include_pad) or to the input (not), or by divisor_override.

How (the template in _pool_render): ALGO "window": one program per (block of BLOCK_P planes,
BLOCK_R output rows x BLOCK_W outputs of the innermost dim); every output reads its window
straight from x with masks, taps walked in scan order (unrolled when UNROLL), fp32 accumulation;
lanes run along the innermost output dim, so the loads of neighbouring outputs are neighbours in
memory.  ALGO "plane" (legal when each window is its whole input plane: global pooling): a
program reduces BLOCK_P planes in chunks of BLOCK_R x BLOCK_W inputs, lanes along the plane.
"""
from __future__ import annotations

import math

from mtmc.kernels import pointwise
from mtmc.kernels.families._pool_render import render
from mtmc.kernels.families._conv_geometry import (
    SPATIAL, is_channel_step, out_names, rank, validate_channel_epilogue,
)
from mtmc.kernels.families.conv import _per_dim, _small_input
from mtmc.kernels.families.elementwise import indent, operand_steps, signature, step_lines
from mtmc.kernels.family import DTYPE_BYTES, Family, TensorArg, elements
from mtmc.kernels.ops import FAMILY_OPS
from mtmc.kernels.spec import DTYPES, KernelSpec

OPS = FAMILY_OPS["pool"]
KINDS = ("max", "avg", "adaptive_max", "adaptive_avg")
POW2 = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
UNROLL_MAX_TAPS = 64        # the default unrolls windows up to this many taps (more: a loop)
TILE_OUTPUTS = 1024         # outputs per program the default aims at (fewer for big windows)
MIN_PROGRAMS = 4 * 132      # ... but keeps at least this many programs (4 per H200 SM)
PLANE_CHUNK = 2048          # inputs per program per step of the "plane" walk
GLOBAL_WINDOW_MAX_TAPS = 4096   # a global pool walks its planes as windows only up to this many taps


def kind(op: str) -> str:
    return op.rsplit("_pool", 1)[0]


def is_adaptive(op: str) -> bool:
    return op.startswith("adaptive")


def is_max(op: str) -> bool:
    return kind(op) in ("max", "adaptive_max")


def out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """One output size of a fixed-window pool, as PyTorch's pooling_output_shape computes it."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:   # the last window must start inside the input
        out -= 1
    return out


def adaptive_taps(size: int, out: int) -> int:
    """The widest adaptive window (what the kernel walks, masked per output)."""
    return -(-size // out) + (0 if size % out == 0 else 1)


def pool_spec(op: str, x_shape, kernel=None, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
              count_include_pad: bool = True, divisor_override=None, output_size=None, indices: bool = False,
              epilogue=(), dtype: str = "float32") -> KernelSpec:
    """The spec of a PyTorch-style pooling call (stride None: the kernel size; output_size: adaptive;
    an output_size entry None keeps that input size, as PyTorch reads it)."""
    if op not in OPS:
        raise ValueError(f"unknown pooling op {op!r}; known: {', '.join(OPS)}")
    r = rank(op)
    if len(x_shape) != r + 2:
        raise ValueError(f"{op} takes a [N, C, {', '.join(SPATIAL[r])}] input; got shape {list(x_shape)}")
    dims = {"N": int(x_shape[0]), "C": int(x_shape[1])}
    dims.update({name: int(v) for name, v in zip(SPATIAL[r], x_shape[2:])})
    p: dict = {}
    if is_adaptive(op):
        if output_size is None:
            raise ValueError(f"{op} needs an output size")
        sizes = _per_dim(output_size, r, "output_size")
        dims.update({o: int(s if s is not None else dims[i]) for o, i, s in zip(out_names(op), SPATIAL[r], sizes)})
    else:
        if kernel is None:
            raise ValueError(f"{op} needs a kernel size")
        p["kernel"] = [int(k) for k in _per_dim(kernel, r, "kernel")]
        p["stride"] = [int(s) for s in _per_dim(stride if stride not in (None, [], ()) else p["kernel"], r, "stride")]
        p["padding"] = [int(x) for x in _per_dim(padding, r, "padding")]
        if is_max(op):
            p["dilation"] = [int(d) for d in _per_dim(dilation, r, "dilation")]
        elif any(d != 1 for d in _per_dim(dilation, r, "dilation")):
            raise ValueError("average pooling takes no dilation")
        p["ceil_mode"] = bool(ceil_mode)
        if not is_max(op):
            p["count_include_pad"] = bool(count_include_pad)
            if divisor_override is not None:
                p["divisor_override"] = int(divisor_override)
        dims.update(output_dims(op, dims, p))
    if indices:
        p["indices"] = True
    if epilogue:
        p["epilogue"] = [dict(s) for s in epilogue]
    return KernelSpec("pool", op, dims, dtype, p)


def output_dims(op: str, dims: dict, params: dict) -> dict[str, int]:
    """A fixed-window pool's output spatial dims for input dims `dims` (what validate() checks)."""
    r = rank(op)
    dil = params.get("dilation") or [1] * r
    return {o: out_size(dims[i], k, s, pad, d, bool(params.get("ceil_mode")))
            for o, i, k, s, pad, d in zip(out_names(op), SPATIAL[r], params["kernel"], params["stride"],
                                          params["padding"], dil)}


def _ints_ok(v, r: int, least: int) -> bool:
    return isinstance(v, list) and len(v) == r and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= least for x in v)


class PoolFamily(Family):
    name = "pool"
    ops = OPS

    # -- what ------------------------------------------------------------------------------
    def epilogue(self, spec: KernelSpec) -> list[dict]:
        return list(spec.params.get("epilogue") or [])

    def prologue(self, spec: KernelSpec) -> list[dict]:
        """Operand-free steps on x before the pool (the activation of a library conv before it)."""
        return list(spec.params.get("prologue") or [])

    def planes(self, spec: KernelSpec, dims: dict | None = None) -> int:
        d = dims or spec.dims
        return d["N"] * d["C"]

    def out_plane(self, spec: KernelSpec, dims: dict | None = None) -> int:
        d = dims or spec.dims
        return math.prod(d[o] for o in out_names(spec.op))

    def in_plane(self, spec: KernelSpec, dims: dict | None = None) -> int:
        d = dims or spec.dims
        return math.prod(d[s] for s in SPATIAL[rank(spec.op)])

    def taps(self, spec: KernelSpec, dims: dict | None = None) -> int:
        """Taps each output walks (adaptive: the widest window)."""
        d, r = dims or spec.dims, rank(spec.op)
        if is_adaptive(spec.op):
            return math.prod(adaptive_taps(d[i], d[o]) for i, o in zip(SPATIAL[r], out_names(spec.op)))
        return math.prod(spec.params["kernel"])

    def is_global(self, spec: KernelSpec, dims: dict | None = None) -> bool:
        """Each window is its whole input plane (one output per plane, no padding)."""
        d, r, p = dims or spec.dims, rank(spec.op), spec.params
        if any(d[o] != 1 for o in out_names(spec.op)):
            return False
        if is_adaptive(spec.op):
            return True
        return (all(x == 0 for x in p["padding"]) and all(x == 1 for x in p.get("dilation") or [1] * r)
                and all(k == d[s] for k, s in zip(p["kernel"], SPATIAL[r])))

    def describe(self, spec: KernelSpec) -> str:
        d, p, r = spec.dims, spec.params, rank(spec.op)
        x = " x ".join(str(d[k]) for k in ("N", "C", *SPATIAL[r]))
        o = " x ".join(str(d[k]) for k in ("N", "C", *out_names(spec.op)))
        words = []
        if not is_adaptive(spec.op):
            words.append(f"kernel {'x'.join(map(str, p['kernel']))}")
            words.append(f"stride {'x'.join(map(str, p['stride']))}")
            if any(p["padding"]):
                words.append(f"padding {'x'.join(map(str, p['padding']))}")
            if any(v != 1 for v in p.get("dilation", [])):
                words.append(f"dilation {'x'.join(map(str, p['dilation']))}")
            if p.get("ceil_mode"):
                words.append("ceil mode")
            if not is_max(spec.op) and any(p["padding"]) and not p.get("count_include_pad", True):
                words.append("padding not counted")
            if p.get("divisor_override"):
                words.append(f"divided by {p['divisor_override']}")
        if p.get("indices"):
            words.append("int64 indices")
        epi, pro = self.epilogue(spec), self.prologue(spec)
        then = f", then {pointwise.describe_chain(epi)}" if epi else ""
        first = f" after {pointwise.describe_chain(pro)}" if pro else ""
        return f"{spec.op}{first}: [{x}] -> [{o}] in {spec.dtype}{', ' if words else ''}{', '.join(words)}{then}"

    def validate(self, spec: KernelSpec) -> None:
        super().validate(spec)
        r, p, d, op = rank(spec.op), spec.params, spec.dims, spec.op
        need = ("N", "C", *SPATIAL[r], *out_names(op))
        missing = [k for k in need if not isinstance(d.get(k), int) or d.get(k) < 1]
        if missing:
            raise ValueError(f"{op} needs positive dims {', '.join(need)}; missing or < 1: {', '.join(missing)}")
        if spec.dtype not in DTYPES:
            raise ValueError(f"dtype {spec.dtype!r} is not supported; use one of {', '.join(DTYPES)}")
        allowed = {"prologue", "epilogue"} | ({"indices"} if is_max(op) else set())
        if not is_adaptive(op):
            allowed |= {"kernel", "stride", "padding", "ceil_mode"}
            allowed |= {"dilation"} if is_max(op) else {"count_include_pad", "divisor_override"}
        unknown = set(p) - allowed
        if unknown:
            raise ValueError(f"{op} does not take {', '.join(sorted(unknown))}; it takes {', '.join(sorted(allowed))}")
        if not is_adaptive(op):
            for key, least in (("kernel", 1), ("stride", 1), ("padding", 0)) + ((("dilation", 1),) if is_max(op) else ()):
                if not _ints_ok(p.get(key), r, least):
                    raise ValueError(f"{op} needs '{key}': {r} int(s) >= {least}; got {p.get(key)!r}")
            for k, pad in zip(p["kernel"], p["padding"]):
                if pad > k // 2:
                    raise ValueError(f"padding {pad} is more than half the kernel size {k} (PyTorch refuses it too)")
            if "divisor_override" in p and r == 1:
                raise ValueError("avg_pool1d takes no divisor_override (PyTorch's has none)")
            if "divisor_override" in p and (not isinstance(p["divisor_override"], int) or p["divisor_override"] < 1):
                raise ValueError(f"divisor_override must be a positive int; got {p['divisor_override']!r}")
            want = output_dims(op, d, p)
            if any(v < 1 for v in want.values()):
                raise ValueError(f"the window does not fit the input: the output would be {want}")
            wrong = {k: v for k, v in want.items() if d[k] != v}
            if wrong:
                raise ValueError(f"output dims {({k: d[k] for k in wrong})} do not follow from the input and "
                                 f"params; they would be {wrong}")
        # applied to each loaded tap, before the padding is filled in
        pointwise.param_chain(p, "prologue", operand_free="pool")
        epi = validate_channel_epilogue(p, "pool")
        if p.get("indices") and epi:
            raise ValueError("a pool that returns indices takes no epilogue (the output is int64 indices)")

    def inputs(self, spec: KernelSpec) -> list[TensorArg]:
        r = rank(spec.op)
        args = [TensorArg("x", ("N", "C", *SPATIAL[r]))]
        epi = self.epilogue(spec)
        for i, name, _ in operand_steps(epi):
            shape = ("C",) if is_channel_step(epi[i]) else pointwise.operand_shape(
                epi[i], full=("N", "C", *out_names(spec.op)))
            args.append(TensorArg(name, shape))
        return args

    def output(self, spec: KernelSpec) -> TensorArg:
        return TensorArg("out", ("N", "C", *out_names(spec.op)), "int64" if spec.params.get("indices") else None)

    def torch_call(self, spec: KernelSpec, x: str) -> str:
        """torch.nn.functional's call computing the pool of x (a float tensor)."""
        p, r, op = spec.params, rank(spec.op), spec.op
        tup = lambda v: "(" + ", ".join(map(str, v)) + ("," if len(v) == 1 else "") + ")"  # noqa: E731
        f = f"torch.nn.functional.{op}"
        if is_adaptive(op):   # the output size is the spec's (check dims keep it, see check_dims)
            size = tup([spec.dims[o] for o in out_names(op)])
            return f"{f}({x}, {size}" + (", return_indices=True)[1]" if p.get("indices") else ")")
        common = f"{f}({x}, {tup(p['kernel'])}, stride={tup(p['stride'])}, padding={tup(p['padding'])}, " \
                 f"ceil_mode={bool(p.get('ceil_mode'))}"
        if is_max(op):
            return common + f", dilation={tup(p['dilation'])}" + (", return_indices=True)[1]" if p.get("indices") else ")")
        extra = f", count_include_pad={bool(p.get('count_include_pad', True))}"
        if p.get("divisor_override"):
            extra += f", divisor_override={p['divisor_override']}"
        return common + extra + ")"

    def reference_source(self, spec: KernelSpec) -> str:
        epi, r, p = self.epilogue(spec), rank(spec.op), spec.params
        names = {i: name for i, name, _ in operand_steps(epi)}
        args = [a.name for a in self.inputs(spec)]
        lines = [signature("reference", args)]
        # [C] operands broadcast over the channel dim of [N, C, *OS]
        lines += [f"    {names[i]} = {names[i]}.reshape(-1{', 1' * r})" for i in names if is_channel_step(epi[i])]
        lines += indent(step_lines(self.prologue(spec), "x", {}, pointwise.torch_expr))
        call = self.torch_call(spec, "x")
        lines.append(f"    x = {call}")
        lines += indent(step_lines(epi, "x", names, pointwise.torch_expr))
        lines.append("    return x")
        source = "\n".join(lines) + "\n"
        if p.get("indices"):   # integer indices are judged exactly, not within a float tolerance
            source += "\n\n" + _INDEX_COMPARE
        return source

    # -- how -------------------------------------------------------------------------------
    def config_space(self, spec: KernelSpec) -> dict[str, list]:
        # a global pool's window walk sums a whole plane per output lane, one tap after another:
        # slow, and over L2 67's 254 x 254 planes its fp32 sum missed the tolerance (H100)
        walk = ["window"] if not self.is_global(spec) or self.taps(spec) <= GLOBAL_WINDOW_MAX_TAPS else []
        return {"ALGO": walk + (["plane"] if self.is_global(spec) else []),
                "BLOCK_P": POW2[:8], "BLOCK_R": POW2[:8], "BLOCK_W": POW2, "UNROLL": [False, True],
                "num_warps": [1, 2, 4, 8]}

    def default_config(self, spec: KernelSpec, hw) -> dict:
        d = spec.dims
        planes, taps = self.planes(spec), self.taps(spec)
        sms = getattr(hw, "sms", 132)
        min_programs = 4 * sms
        if self.is_global(spec):
            # one output per plane: lanes along the plane, a chunk of it per step
            bw = min(PLANE_CHUNK, _pow2(self.in_plane(spec)))
            # small planes: several per program, ~8K inputs a step (2K measured 20 % of the copy
            # bandwidth on the H200 for 14 x 14 planes: too little work per program)
            bp = min(_pow2(planes), max(1, 4 * PLANE_CHUNK // bw), POW2[7])
            while bp > 1 and -(-planes // bp) < min_programs:
                bp //= 2
            return {"ALGO": "plane", "BLOCK_P": bp, "BLOCK_R": 1, "BLOCK_W": min(bw, POW2[-1]),
                    "UNROLL": False, "num_warps": 8 if bp * bw >= 2048 else 4}
        names = out_names(spec.op)
        ow, rows = d[names[-1]], math.prod(d[o] for o in names[:-1])
        # fewer outputs per program for big windows: about 4K loads in flight per program
        target = max(128, min(TILE_OUTPUTS, 1 << (4096 // max(1, taps)).bit_length() - 1 if taps <= 4096 else 1))
        bw = min(_pow2(ow), 128, target)
        br = min(_pow2(rows), max(1, target // bw), POW2[7])
        bp = min(_pow2(planes), max(1, target // (bw * br)), POW2[7])

        def programs() -> int:
            return -(-planes // bp) * -(-rows // br) * -(-ow // bw)
        while programs() < min_programs and bp * br * bw > 64:   # enough programs to fill the GPU
            if bp > 1:
                bp //= 2
            elif br > 1:
                br //= 2
            else:
                bw //= 2
        tile = bp * br * bw
        return {"ALGO": "window", "BLOCK_P": bp, "BLOCK_R": br, "BLOCK_W": bw,
                "UNROLL": taps <= UNROLL_MAX_TAPS, "num_warps": max(1, min(8, tile // 128))}

    def render(self, spec: KernelSpec, config: dict) -> str:
        cfg = {k: config[k] for k in self.config_space(spec)}
        return render(self, spec, cfg)

    # -- cost and checking -----------------------------------------------------------------
    def programs(self, spec: KernelSpec, config: dict) -> int:
        d, names = spec.dims, out_names(spec.op)
        bp = int(config["BLOCK_P"])
        if config.get("ALGO") == "plane":
            return -(-self.planes(spec) // bp)
        rows = math.prod(d[o] for o in names[:-1])
        return -(-self.planes(spec) // bp) * -(-rows // int(config["BLOCK_R"])) * -(-d[names[-1]] // int(config["BLOCK_W"]))

    def work(self, spec: KernelSpec) -> tuple[float, float]:
        planes, out_plane = self.planes(spec), self.out_plane(spec)
        out_numel = planes * out_plane
        epi = self.epilogue(spec)
        elem = DTYPE_BYTES[spec.dtype]
        operand_elems = elements(self.inputs(spec)[1:], spec.dims)
        out_bytes = out_numel * (8 if spec.params.get("indices") else elem)
        flops = out_numel * (self.taps(spec) * (1 + len(self.prologue(spec))) + len(epi))
        return float(flops), float((planes * self.in_plane(spec) + operand_elems) * elem + out_bytes)

    def check_dims(self, spec: KernelSpec, config: dict) -> dict[str, int]:
        """Two images; channels cut to cover two plane blocks plus a tail; spatial sizes cut so the
        output keeps a few BLOCK_R x BLOCK_W tiles, with the same remainder mod the stride (the
        last window's clipping); adaptive pools keep their output size when small."""
        d, p, r, op = spec.dims, spec.params, rank(spec.op), spec.op
        names = out_names(op)
        bp, br, bw = int(config["BLOCK_P"]), int(config["BLOCK_R"]), int(config["BLOCK_W"])
        n = min(d["N"], 2)
        c = min(d["C"], max(1, -(-2 * bp // n) + 1))
        dims = {"N": n, "C": c}
        if config.get("ALGO") == "plane":
            if not is_adaptive(op):   # the window is baked in as the whole plane: keep the plane
                return {**dims, **{s: d[s] for s in SPATIAL[r]}, **{o: 1 for o in names}}
            left = 2 * br * bw + 1    # more than two chunks of the plane, a partial last one
            for s in SPATIAL[r][::-1]:
                dims[s] = min(d[s], left)
                left = max(1, -(-left // dims[s]))
            return {**dims, **{o: 1 for o in names}}
        # output targets per dim: innermost two BLOCK_W tiles + 1, rows two BLOCK_R tiles + 1
        targets = [2 * br + 1] * (r - 1) + [2 * bw + 1]
        if r == 3:
            targets = [2, max(2, -(-(2 * br + 1) // 2)), 2 * bw + 1]
        for i, (s_name, o_name) in enumerate(zip(SPATIAL[r], names)):
            want = min(d[o_name], targets[i])
            if is_adaptive(op):
                # the output size is the reference's literal: it stays; the input shrinks to a few
                # windows per output, keeping uneven windows (a remainder) where the real one has them
                size, out = d[s_name], d[o_name]
                if size > out:
                    size = min(size, out * min(size // out, 3) + size % out)
                dims[s_name], dims[o_name] = size, out
                continue
            k, s, pad = p["kernel"][i], p["stride"][i], p["padding"][i]
            dil = (p.get("dilation") or [1] * r)[i]
            ceil = bool(p.get("ceil_mode"))
            size = _small_input(d[s_name], want, s, lambda n, k=k, s=s, pad=pad, dil=dil: out_size(n, k, s, pad, dil, ceil))
            dims[s_name] = size
            dims[o_name] = out_size(size, k, s, pad, dil, bool(p.get("ceil_mode")))
        return dims


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


_INDEX_COMPARE = '''
def compare(out, x, *operands):
    """Indices are judged exactly: PyTorch's scan order picks the first maximum, and so must the kernel."""
    import math
    want = reference(x, *operands)
    if tuple(out.shape) != tuple(want.shape) or out.dtype != torch.int64:
        return False, f"output is {out.dtype} {tuple(out.shape)}, expected int64 {tuple(want.shape)}", math.inf, math.inf
    wrong = int((out != want).sum())
    if wrong:
        return False, f"{wrong} of {want.numel()} indices differ from PyTorch's", math.inf, math.inf
    return True, "every index equals PyTorch's", 0.0, 0.0
'''

FAMILY = PoolFamily()
