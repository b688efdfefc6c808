"""The pool family's Triton source: one kernel (ALGO "window" or "plane") and launch().

The window geometry (kernel, stride, padding, dilation, divisor) is baked into the source as
literals, so the compiler folds it; sizes and strides are read from the tensors at launch, so one
source serves the real shape on a GPU and small shapes in the interpreter.  Adaptive windows
depend on the sizes: launch() passes the widest one per dim as a constexpr and each output masks
the taps past its own end.  Only the spatial dims the op has are generated.
"""
from __future__ import annotations

import math

from mtmc.kernels import pointwise
from mtmc.kernels.families._conv_geometry import SPATIAL, is_channel_step, out_names, rank
from mtmc.kernels.families.elementwise import (
    IMPORTS, INTERPRETED_SOURCE, config_line, indent, interpreter_ints, operand_steps, signature, step_lines,
)
from mtmc.kernels.spec import KernelSpec

class _Dim:
    """One spatial dim: its names and window geometry, and the expressions the kernel uses."""

    def __init__(self, name: str, i: int, params: dict, adaptive: bool):
        self.v = name.lower()
        self.size, self.out = name, "O" + name
        self.adaptive = adaptive
        if adaptive:
            self.k, self.s, self.p, self.dil = f"K_{name}", 1, 0, 1
        else:
            self.k, self.s, self.p = params["kernel"][i], params["stride"][i], params["padding"][i]
            self.dil = (params.get("dilation") or [1] * 3)[i]
        self.ceil = bool(params.get("ceil_mode"))

    def start_lines(self) -> list[str]:
        """The window's first input index (and an adaptive window's end) for output o_v."""
        v = self.v
        if self.adaptive:
            return [f"i0_{v} = (o_{v} * {self.size}) // {self.out}  # PyTorch's start_index",
                    f"e_{v} = ((o_{v} + 1) * {self.size} + {self.out} - 1) // {self.out}  # and end_index"]
        base = f"o_{v}" if self.s == 1 else f"o_{v} * {self.s}"
        return [f"i0_{v} = {base} - {self.p}" if self.p else f"i0_{v} = {base}"]

    def tap(self, k: str) -> str:
        return f"i0_{self.v} + {k}" if self.dil == 1 else f"i0_{self.v} + {k} * {self.dil}"

    def checks(self) -> list[str]:
        """Bounds the taps of this dim need ([] where the geometry keeps every tap inside)."""
        i = f"i_{self.v}"
        if self.adaptive:
            return [f"({i} < e_{self.v})"]
        lower = self.p > 0
        upper = self.p > 0 or self.ceil
        return ([f"({i} >= 0)"] if lower else []) + ([f"({i} < {self.size})"] if upper else [])


class _Render:
    def __init__(self, fam, spec: KernelSpec, cfg: dict):
        self.fam, self.spec, self.cfg = fam, spec, cfg
        self.r = rank(spec.op)
        self.adaptive = spec.op.startswith("adaptive")
        self.max = "max_pool" in spec.op
        self.indices = bool(spec.params.get("indices"))
        self.dims = [_Dim(n, i, spec.params, self.adaptive) for i, n in enumerate(SPATIAL[self.r])]
        self.epi = fam.epilogue(spec)
        self.pro = fam.prologue(spec)
        self.operands = [name for _, name, _ in operand_steps(self.epi)]
        self.plane = cfg["ALGO"] == "plane"

    # -- shared pieces -------------------------------------------------------------------------
    def _params(self) -> list[str]:
        sizes = [d.size for d in self.dims] + [d.out for d in self.dims]
        consts = ["BLOCK_P", "BLOCK_R", "BLOCK_W", "INDEX_64"]
        if self.plane:
            consts.append("CONTIGUOUS")
        elif self.adaptive:
            consts += [d.k for d in self.dims]
        return ["x_ptr", *(f"{o}_ptr" for o in self.operands), "out_ptr", "P", "C", *sizes, "ROWS",
                "sx_n", "sx_c", *(f"sx_{d.v}" for d in self.dims), *(f"{c}: tl.constexpr" for c in consts)]

    def _planes(self, first: str) -> list[str]:
        return [f"p = {first} + tl.arange(0, BLOCK_P)  # planes (image, channel) of this program",
                "p_ok = p < P",
                "if INDEX_64:  # offsets reach 2**31: 32-bit ones would wrap",
                "    p = p.to(tl.int64)",
                "c = p % C",
                "x_plane = (p // C) * sx_n + c * sx_c  # read through x's strides: no copy"]

    def _fill(self) -> str:
        return 'float("-inf")' if self.max else "0.0"

    def _load(self, addr: str, mask: str) -> list[str]:
        """v: the taps at addr in fp32, the prologue applied; masked-off taps (padding, past the
        plane) hold the pool's fill, not the prologue of it."""
        if not self.pro:
            return [f"v = tl.load({addr}, mask={mask}, other={self._fill()}).to(tl.float32)"]
        return [f"v = tl.load({addr}, mask={mask}, other=0.0).to(tl.float32)",
                f"v = tl.where({mask}, {pointwise.triton_expr(self.pro, 'v', {})}, {self._fill()})  # prologue"]

    def _update(self, v: str, flat: str, shape: str) -> list[str]:
        """Fold value v (and its flat plane index) into the running max or sum."""
        if not self.max:
            return [f"acc += {v}"]
        lines = [f"take = ({v} > acc) | ({v} != {v})  # strictly greater: the first maximum wins; NaN propagates",
                 f"acc = tl.where(take, {v}, acc)"]
        if self.indices:
            lines.append(f"idx = tl.where(take, {flat}{shape}, idx)")
        return lines

    def _init(self, shape: str) -> list[str]:
        lines = [f"acc = tl.full({shape}, {self._fill()}, tl.float32)"]
        if self.indices:
            lines.append(f"idx = tl.zeros({shape}, tl.int64)")
        return lines

    def _store(self, offs: str, mask: str, c_offs: str, c_mask: str) -> list[str]:
        if self.indices:
            return [f"tl.store(out_ptr + {offs}, idx, mask={mask})"]
        names, lines = {}, []
        for i, name, _ in operand_steps(self.epi):
            o, m = (c_offs, c_mask) if is_channel_step(self.epi[i]) else (offs, mask)
            lines.append(pointwise.operand_load(name, self.epi[i], o, m))
            names[i] = name
        if self.epi:
            lines.insert(0, "# epilogue on the fp32 result")
        return lines + step_lines(self.epi, "x", names) + [
            f"tl.store(out_ptr + {offs}, x.to(out_ptr.dtype.element_ty), mask={mask})"]

    # -- ALGO "window" ---------------------------------------------------------------------------
    def window_kernel(self) -> str:
        last = self.dims[-1]
        body = ["# sizes in inline arithmetic, not tl.cdiv: each jit call costs the interpreter dearly",
                f"w_tiles = ({last.out} + BLOCK_W - 1) // BLOCK_W",
                "r_tiles = (ROWS + BLOCK_R - 1) // BLOCK_R",
                "# program -> (plane block, row block, innermost block), innermost fastest: programs that",
                "# run together read neighbouring input rows",
                "pid = tl.program_id(0)",
                "pw = pid % w_tiles",
                "rest = pid // w_tiles",
                "pr = rest % r_tiles",
                "pp = rest // r_tiles",
                *self._planes("pp * BLOCK_P"),
                "j = tl.arange(0, BLOCK_R * BLOCK_W)",
                f"o_{last.v} = pw * BLOCK_W + j % BLOCK_W  # lanes along the innermost output dim",
                "row = pr * BLOCK_R + j // BLOCK_W  # the output row (the outer output dims, flattened)",
                f"s_ok = (o_{last.v} < {last.out}) & (row < ROWS)"]
        if self.r == 2:
            body.append(f"o_{self.dims[0].v} = row")
        elif self.r == 3:
            d0, d1 = self.dims[0], self.dims[1]
            body += [f"o_{d1.v} = row % {d1.out}", f"o_{d0.v} = row // {d1.out}"]
        for d in self.dims:
            body += d.start_lines()
        body += ["mask = p_ok[:, None] & s_ok[None, :]", *self._init("(BLOCK_P, BLOCK_R * BLOCK_W)")]
        body += self._taps(0, [], "")
        body += self._result()
        s_out = " * ".join(d.out for d in self.dims)
        body += [f"offs = p[:, None] * ({s_out}) + (row * {last.out} + o_{last.v})[None, :]",
                 *self._store("offs", "mask", "c[:, None]", "p_ok[:, None]")]
        return "@triton.jit\n" + signature("pool_kernel", self._params()) + "\n" + "\n".join(indent(body)) + "\n"

    def _taps(self, level: int, checks: list[str], off: str) -> list[str]:
        """The nested tap loops, outermost dim first (PyTorch's scan order); each level adds its
        dim's offset and bounds check to the ones above it."""
        d = self.dims[level]
        v = d.v
        loop = "tl.static_range" if self.cfg["UNROLL"] else "range"
        lines = [f"for k_{v} in {loop}({d.k}):",
                 f"    i_{v} = {d.tap(f'k_{v}')}"]
        my_checks = d.checks()
        ok = None
        if my_checks or checks:
            ok = f"ok_{v}"
            lines.append(f"    {ok} = " + " & ".join(([checks[-1]] if checks else []) + my_checks))
        offset = f"off_{v}"
        lines.append(f"    {offset} = " + (f"{off} + " if off else "") + f"i_{v} * sx_{v}")
        if self.indices:
            above = f"f_{self.dims[level - 1].v} * {d.size} + " if level else ""
            lines.append(f"    f_{v} = {above}i_{v}  # the flat index within the input plane")
        if level + 1 < len(self.dims):
            lines += indent(self._taps(level + 1, [ok] if ok else [], offset))
            return lines
        m = "mask" if ok is None else f"(mask & {ok}[None, :])"
        lines += [*indent(self._load(f"x_ptr + x_plane[:, None] + {offset}[None, :]", m)),
                  *indent(self._update("v", f"f_{v}", "[None, :]"))]
        return lines

    def _result(self) -> list[str]:
        """x: the fp32 pool value per output (the divisor of an average, per output)."""
        if self.max:
            return ["x = acc"]
        p = self.spec.params
        if p.get("divisor_override"):
            return [f"x = acc / {float(p['divisor_override'])}"]
        lines = []
        counts = []
        for d in self.dims:
            v = d.v
            if self.adaptive:
                counts.append(f"(e_{v} - i0_{v})")
                continue
            if not d.p and not d.ceil:
                counts.append(str(d.k))   # every window lies inside the input
                continue
            lines.append(f"e_{v} = tl.minimum(i0_{v} + {d.k}, {d.size} + {d.p})  # the window, clipped to the padded input")
            if p.get("count_include_pad", True):
                counts.append(f"(e_{v} - i0_{v})")
            else:
                lines.append(f"n_{v} = tl.minimum(e_{v}, {d.size}) - tl.maximum(i0_{v}, 0)  # ... and to the input")
                counts.append(f"n_{v}")
        if all(c.isdigit() for c in counts):
            return lines + [f"x = acc / {float(math.prod(int(c) for c in counts))}"]
        lines.append("count = tl.maximum(" + " * ".join(counts) + ", 1)  # >= 1 (masked lanes too: no 0 / 0)")
        return lines + ["x = acc / count.to(tl.float32)[None, :]"]

    # -- ALGO "plane" ---------------------------------------------------------------------------
    def plane_kernel(self) -> str:
        s_in = " * ".join(d.size for d in self.dims)
        body = [*self._planes("tl.program_id(0) * BLOCK_P"),
                "j = tl.arange(0, BLOCK_R * BLOCK_W)  # lanes along the input plane",
                f"S_in = {s_in}",
                *self._init("(BLOCK_P, BLOCK_R * BLOCK_W)"),
                "n_chunks = (S_in + BLOCK_R * BLOCK_W - 1) // (BLOCK_R * BLOCK_W)",
                *interpreter_ints(["n_chunks"]),
                "for chunk in range(0, n_chunks):",
                "    i = chunk * (BLOCK_R * BLOCK_W) + j",
                "    ok = i < S_in",
                "    if CONTIGUOUS:  # the plane lies flat: its index is its offset",
                "        off = i",
                "    else:",
                *indent(self._decode("i"), 2),
                *indent(self._load("x_ptr + x_plane[:, None] + off[None, :]", "(p_ok[:, None] & ok[None, :])")),
                *indent(self._update("v", "i", "[None, :]"))]
        if self.max:
            body += ["# across lanes: the largest value, the first index holding it (NaN first, as scanned)",
                     "nan = acc != acc",
                     "any_nan = tl.max(nan.to(tl.int32), axis=1) > 0",
                     'safe = tl.where(nan, float("-inf"), acc)',
                     "best = tl.max(safe, axis=1)",
                     'x = tl.where(any_nan, float("nan"), best)']
            if self.indices:
                body += ["hit = tl.where(any_nan[:, None], nan, safe == best[:, None])",
                         "idx = tl.min(tl.where(hit, idx, S_in), axis=1)"]
        else:
            div = self.spec.params.get("divisor_override")
            body.append("x = tl.sum(acc, axis=1) / " + (f"{float(div)}" if div else "S_in"))
        body += self._store("p", "p_ok", "c", "p_ok")
        return "@triton.jit\n" + signature("pool_kernel", self._params()) + "\n" + "\n".join(indent(body)) + "\n"

    def _decode(self, i: str) -> list[str]:
        """Flat plane index -> offset through x's strides (a plane that is not contiguous)."""
        lines, rest = [], i
        for d in reversed(self.dims[1:]):
            lines += [f"q_{d.v} = {rest} % {d.size}", f"r_{d.v} = {rest} // {d.size}"]
            rest = f"r_{d.v}"
        parts = [f"{rest} * sx_{self.dims[0].v}"] + [f"q_{d.v} * sx_{d.v}" for d in self.dims[1:]]
        return lines + ["off = " + " + ".join(parts)]

    # -- launch ----------------------------------------------------------------------------------
    def launch(self) -> str:
        names = [a.name for a in self.fam.inputs(self.spec)]
        r = self.r
        sizes = ", ".join(d.size for d in self.dims)
        outs = ", ".join(d.out for d in self.dims)
        comma = "," if r == 1 else ""
        rows = " * ".join(d.out for d in self.dims[:-1]) or "1"
        full = [o for i, o, _ in operand_steps(self.epi) if not is_channel_step(self.epi[i])]
        lines = ['assert out.is_contiguous(), "out must be contiguous"']
        if full:
            lines.append(f"{', '.join(full)}{',' if len(full) == 1 else ''} = "
                         f"{', '.join(f'{o}.contiguous()' for o in full)}{',' if len(full) == 1 else ''}"
                         "  # indexed like out")
        cfg = self.cfg
        lines += ["N, C = x.shape[0], x.shape[1]",
                  f"{sizes}{comma} = x.shape[2:]",
                  f"{outs}{comma} = out.shape[2:]",
                  f"P, ROWS = N * C, {rows}",
                  f"BLOCK_P, BLOCK_R, BLOCK_W = {cfg['BLOCK_P']}, {cfg['BLOCK_R']}, {cfg['BLOCK_W']}",
                  "if out.numel() == 0:",
                  "    return",
                  "# the farthest element x's strides reach, and out's last one",
                  "span = 1 + sum((s - 1) * st for s, st in zip(x.shape, x.stride()))",
                  "INDEX_64 = max(span, out.numel()) + BLOCK_P * BLOCK_R * BLOCK_W >= 2**31"]
        extra = []
        if self.plane:
            grid = "triton.cdiv(P, BLOCK_P)"
            contiguous = " and ".join(["x.stride(-1) == 1"] + [
                f"x.stride({2 + i}) == {' * '.join(d.size for d in self.dims[i + 1:])}" for i in range(r - 1)])
            lines.append(f"CONTIGUOUS = {contiguous}")
            extra.append("CONTIGUOUS=CONTIGUOUS")
        else:
            grid = f"triton.cdiv(P, BLOCK_P) * triton.cdiv(ROWS, BLOCK_R) * triton.cdiv({self.dims[-1].out}, BLOCK_W)"
            if self.adaptive:
                lines.append("# the widest adaptive window per dim; each output masks the taps past its end")
                for d in self.dims:
                    lines.append(f"{d.k} = -(-{d.size} // {d.out}) + (0 if {d.size} % {d.out} == 0 else 1)")
                    extra.append(f"{d.k}={d.k}")
        lines += [f"pool_kernel[({grid},)](x, {', '.join([*self.operands, 'out'])}, P, C, {sizes}, {outs}, ROWS,",
                  "                      *x.stride(), BLOCK_P=BLOCK_P, BLOCK_R=BLOCK_R, BLOCK_W=BLOCK_W,",
                  f"                      INDEX_64=INDEX_64, {''.join(e + ', ' for e in extra)}"
                  f"num_warps={cfg['num_warps']})"]
        return signature("launch", [*names, "*", "out"]) + "\n" + "\n".join(indent(lines)) + "\n"

    def header(self) -> str:
        return f"# {self.fam.describe(self.spec)}\n# config: {config_line(self.cfg)}\n"


def render(fam, spec: KernelSpec, cfg: dict) -> str:
    r = _Render(fam, spec, cfg)
    blocks = [INTERPRETED_SOURCE, r.plane_kernel() if r.plane else r.window_kernel(), r.launch()]
    return r.header() + "import os\n" + IMPORTS + "\n\n" + "\n\n\n".join(b.strip("\n") for b in blocks) + "\n"
