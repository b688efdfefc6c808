"""Speed without a GPU: a roofline estimate with config-dependent efficiencies.

Only for ranking configs offline; every result says {"measured": False} and is labelled as an
estimate.  The model, in the order it is applied:
  * ideal = max(bytes / bandwidth, flops / peak) from family.work(spec) (tensor-core peak for
    fp16/bf16 matmul, the fp32 peak otherwise);
  * matmul traffic: each wave of concurrent tiles reads its A row-panels and B column-panels from
    DRAM once, so small tiles and row-major rasterization re-read more (GROUP_M makes a wave's
    footprint squarer); all of it comes through L2, which has finite bandwidth too; if A and B fit
    in half of L2 they are read from DRAM once.  Split-K adds fp32 partial-sum read-modify-writes;
  * achievable bandwidth (Little's law): the bytes in flight of the resident programs must cover
    bandwidth x latency; occupancy (regs / smem -> blocks per SM) and tile size set them;
  * compute: wave quantization (programs over SMs; blocks resident on one SM share its math
    units) and, for matmul, small tiles and short K-steps under-feeding the tensor cores;
  * the busiest of DRAM, L2, math and block scheduling (~50 ns per program per SM) bounds the
    time, combined as a smooth maximum so that every resource near its limit shows;
  * latency: a loop step cannot beat DRAM latency / (num_stages - 1), the loads it keeps in
    flight ahead of its math (1 stage also serializes loads and math);
  * fixed costs: ~3 us per launch, one latency of pipeline fill per wave (once if persistent);
  * register spills multiply the time; a config that cannot launch is infeasible.
Knobs read from the config (missing ones take Triton's defaults): BLOCK_M, BLOCK_N, BLOCK_K,
GROUP_M, SPLIT_K, BLOCK (elementwise), ROWS_PER_PROG and BLOCK_N (row ops), num_warps,
num_stages, PERSISTENT.  A conv is modelled as the implicit GEMM its family's `gemm_dims`
gives.  A family may sharpen the estimate with optional methods
`programs(spec, config) -> int`, `traffic(spec, config) -> float` (bytes actually moved) and
`steps(spec, config) -> int` (loop iterations per program), and `tensor_core = True` (its flops
run on tensor cores, as attention's do).
"""
from __future__ import annotations

import math

from mtmc.kernels.catalog import family_of
from mtmc.kernels.family import DTYPE_BYTES
from mtmc.kernels.spec import KernelSpec
from mtmc.tools.hardware import HardwareProfile
from mtmc.tools.target_compile import blocks_per_sm

LABEL = "estimate (no GPU): roofline model"
LAUNCH_US = 3.0            # host launch + grid setup per kernel launch
DRAM_LATENCY_NS = 700.0    # loaded DRAM latency, for Little's law and pipeline fill
L2_BANDWIDTH_RATIO = 3.0   # L2 read bandwidth / DRAM bandwidth (Hopper: 128x128 fp16 tiles reach ~700 TFLOP/s)
SPILL_PENALTY_BYTES = 256  # each this many spilled bytes per thread adds 1x time (capped at 4x)
PROGRAM_START_NS = 50.0    # block scheduling, index math and tail per program, per SM
SMOOTH_MAX_POWER = 4       # resources near their limits slow each other: a smooth maximum
_BLOCKING = ("smem_overflow", "too_many_regs", "compile_error")


def _knob(config: dict, names: tuple[str, ...], default):
    lower = {k.lower(): v for k, v in config.items()}
    for n in names:
        if n.lower() in lower and lower[n.lower()] is not None:
            return lower[n.lower()]
    return default


def _is_matmul(spec: KernelSpec) -> bool:
    """A tiled GEMM: matmul, and conv (an implicit GEMM; its family gives the GEMM's dims)."""
    return spec.family in ("matmul", "conv")


def _numel(spec: KernelSpec, arg) -> int:
    return math.prod(arg.concrete_shape(spec.dims))


def roofline(spec: KernelSpec, profile: HardwareProfile) -> dict:
    """The least time any kernel needs on `profile`, and which resource bounds it."""
    family = family_of(spec)
    flops, nbytes = family.work(spec)
    tensor_core = (_is_matmul(spec) or getattr(family, "tensor_core", False)) and spec.dtype in ("float16", "bfloat16")
    peak = profile.peak_tflops(spec.dtype, tensor_core) * 1e12
    bw = profile.bandwidth_gbs * 1e9
    memory_s, compute_s = nbytes / bw, flops / peak
    return {"flops": flops, "bytes": nbytes, "intensity": flops / nbytes if nbytes else math.inf,
            "ridge": peak / bw, "bound": "memory" if memory_s >= compute_s else "compute",
            "memory_ms": memory_s * 1e3, "compute_ms": compute_s * 1e3,
            "ideal_ms": max(memory_s, compute_s) * 1e3, "peak_tflops": peak / 1e12,
            "bandwidth_gbs": profile.bandwidth_gbs, "tensor_core": tensor_core, "device": profile.name}


# -- the shape of the work ------------------------------------------------------------------
class _Shape:
    """What the config implies: programs, elements per program-iteration, looping, smem, regs."""

    def __init__(self, spec: KernelSpec, config: dict, family):
        self.spec, self.config, self.family = spec, config, family
        self.elem = DTYPE_BYTES.get(spec.dtype, 4)
        self.num_warps = int(_knob(config, ("num_warps",), 4))
        self.num_stages = int(_knob(config, ("num_stages",), 3))
        self.split_k = int(_knob(config, ("SPLIT_K",), 1))
        self.group_m = int(_knob(config, ("GROUP_M", "GROUP_SIZE_M"), 1))
        self.persistent = bool(_knob(config, ("PERSISTENT",), False))
        out = family.output(spec)
        ins = family.inputs(spec)
        self.out_numel = _numel(spec, out)
        self.max_numel = max([self.out_numel] + [_numel(spec, a) for a in ins])
        if _is_matmul(spec):
            self._matmul()
        else:
            self._streaming()
        # a family whose streaming kernel is not one tile walk per row says its own shape:
        # (programs, elements per program-iteration, iterations), or None for the default
        shape = getattr(family, "stream_shape", lambda spec, config: None)(spec, config)
        if shape is not None:
            self.programs, self.tile_elems, self.steps = shape
            self.loops = self.steps > 1
        hook = getattr(family, "programs", None)
        if callable(hook):
            self.programs = int(hook(spec, config))
        hook = getattr(family, "steps", None)   # loop iterations of one program, where the family knows
        if callable(hook):
            self.steps, self.loops = int(hook(spec, config)), True

    def _matmul(self):
        gemm = getattr(self.family, "gemm_dims", None)
        d, c = (gemm(self.spec) if callable(gemm) else self.spec.dims), self.config
        self.M, self.N, self.K = d["M"], d["N"], d["K"]
        self.B = max(1, self.out_numel // (self.M * self.N))   # batch, whatever the op calls it
        self.bm = int(_knob(c, ("BLOCK_M",), 64))
        self.bn = int(_knob(c, ("BLOCK_N",), 64))
        self.bk = int(_knob(c, ("BLOCK_K",), 32))
        self.tiles_m, self.tiles_n = math.ceil(self.M / self.bm), math.ceil(self.N / self.bn)
        self.steps = math.ceil(self.K / self.split_k / self.bk)          # K-loop iterations
        self.tiles = self.B * self.tiles_m * self.tiles_n
        self.programs = self.tiles * self.split_k
        self.loops = True
        self.stage_bytes = (self.bm + self.bn) * self.bk * self.elem   # one K-step's A and B tiles
        self.smem = self.num_stages * self.stage_bytes
        threads = self.num_warps * 32
        # fp32 accumulator plus the A fragment (Hopper reads B straight from shared memory)
        self.regs = 32 + math.ceil(self.bm * self.bn / threads) + math.ceil(self.bm * self.bk * self.elem / 4 / threads)

    def _streaming(self):
        c, d = self.config, self.spec.dims
        if self.spec.family == "elementwise":
            block = int(_knob(c, ("BLOCK", "BLOCK_SIZE"), 1024))
            self.programs = math.ceil(self.out_numel / block)
            self.tile_elems, self.loops, self.steps = block, False, 1
        else:  # row ops: ROWS rows per program, BLOCK_N columns per loop step
            n = int(d.get("N", self.max_numel))
            rows = max(1, self.max_numel // n)
            per_program = int(_knob(c, ("ROWS_PER_PROG", "ROWS", "BLOCK_M"), 1))
            block_n = int(_knob(c, ("BLOCK_N", "BLOCK"), triton_next_pow2(n)))
            self.programs = math.ceil(rows / per_program)
            self.tile_elems, self.loops = per_program * min(block_n, n), block_n < n
            self.steps = math.ceil(n / block_n)
        self.smem = 0
        threads = self.num_warps * 32
        # a streamed element lives in one register; a row tile also keeps its temporaries
        # (exp(x), x - mean) alive across the reduction
        per_elem = 1 if self.spec.family == "elementwise" else 2
        self.regs = 24 + per_elem * math.ceil(self.tile_elems / threads)


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# -- the model ------------------------------------------------------------------------------
def _matmul_traffic(s: _Shape, resident: int, profile: HardwareProfile) -> tuple[float, float]:
    """(DRAM bytes, L2 bytes) of a tiled matmul whose `resident` programs run at once."""
    a_bytes = s.B * s.M * s.K * s.elem
    b_bytes = s.B * s.K * s.N * s.elem
    wave = max(1, min(s.tiles, resident // max(1, s.split_k)))
    rows = min(s.tiles_m * s.B, max(min(s.group_m, wave), math.ceil(wave / s.tiles_n)))
    cols = min(s.tiles_n, math.ceil(wave / rows))
    if a_bytes + b_bytes <= profile.l2_bytes / 2:
        a_reads = b_reads = 1.0     # re-reads hit L2
    else:
        a_reads, b_reads = max(1.0, s.tiles_n / cols), max(1.0, s.tiles_m / rows)
    l2 = a_bytes * s.tiles_n + b_bytes * s.tiles_m   # every tile reads its panels through L2
    partials = 2 * s.split_k * s.B * s.M * s.N * 4 if s.split_k > 1 else 0   # fp32 read-modify-write
    return a_bytes * a_reads + b_bytes * b_reads + partials, l2 + partials


def _resources(resources: dict | None, profile: HardwareProfile, s: _Shape) -> dict:
    """Blocks per SM, spills and launches: from a compile report when given, else from the config."""
    threads = s.num_warps * 32
    if resources:
        blocking = [v for v in resources.get("violations", []) if v.get("kind") in _BLOCKING]
        kernels = [k for k in resources.get("kernels", []) if not k.get("error")]
        if blocking or not kernels:
            why = blocking[0]["detail"] if blocking else "the compile report has no kernel"
            return {"feasible": False, "reason": why}
        bpsm = min(blocks_per_sm(profile, k["num_warps"] * 32, k.get("regs"), k.get("shared_bytes", 0))
                   for k in kernels)
        spill = max(k.get("spill_bytes", 0) for k in kernels)
        launches = sum(max(1, k.get("launches", 1)) for k in kernels)
        source = "compile report"
    else:
        if s.smem > profile.smem_per_block:
            return {"feasible": False, "reason": f"would need about {s.smem} B of shared memory per block; "
                                                 f"{profile.name} allows {profile.smem_per_block} B"}
        # ptxas caps registers so the block fits on an SM, spilling the rest
        cap = min(profile.max_regs_per_thread, profile.regs_per_sm // threads // 8 * 8)
        regs = min(cap, s.regs)
        spill = max(0, s.regs - cap) * 4
        bpsm = blocks_per_sm(profile, threads, regs, s.smem)
        launches = 1 + (1 if s.split_k > 1 else 0)   # split-K: zero the output (or reduce) first
        source = "config (no compile report)"
    if bpsm == 0:
        return {"feasible": False, "reason": "no block of this config fits on an SM"}
    return {"feasible": True, "blocks_per_sm": bpsm, "spill_bytes": spill, "launches": launches,
            "occupancy": bpsm * threads / profile.max_threads_per_sm, "resources_from": source}


def _smooth_max(*times: float) -> float:
    return sum(t ** SMOOTH_MAX_POWER for t in times) ** (1.0 / SMOOTH_MAX_POWER)


def _memory(s: _Shape, roof: dict, resident: int, profile: HardwareProfile) -> dict:
    """DRAM and L2 bytes and seconds, with bandwidth limited by the bytes in flight."""
    if _is_matmul(s.spec):
        dram, l2 = _matmul_traffic(s, resident, profile)
        dram += max(0.0, roof["bytes"] - (s.B * s.M * s.K + s.B * s.K * s.N) * s.elem)  # C, epilogue
        per_block_inflight = max(1, s.num_stages - 1) * s.stage_bytes
    else:
        hook = getattr(s.family, "traffic", None)
        dram = float(hook(s.spec, s.config)) if callable(hook) else roof["bytes"]
        l2 = 0.0
        pipelined = max(1, s.num_stages - 1) if s.loops else 1
        per_block_inflight = s.tile_elems * roof["bytes"] / s.max_numel * pipelined
    bw = profile.bandwidth_gbs * 1e9
    bw_eff = min(1.0, resident * per_block_inflight / (bw * DRAM_LATENCY_NS * 1e-9))
    return {"dram": dram, "l2": l2, "bw_eff": bw_eff,
            "dram_s": dram / (bw * bw_eff), "l2_s": l2 / (bw * L2_BANDWIDTH_RATIO)}


def _compute(s: _Shape, roof: dict, profile: HardwareProfile) -> dict:
    """Math seconds after wave quantization and, for matmul, tensor-core feeding."""
    # co-resident blocks share their SM's math units: the busiest SM sets the compute time
    wave_eff = s.programs / (profile.sms * math.ceil(s.programs / profile.sms))
    tile_eff = 1.0
    if _is_matmul(s.spec):
        tile_eff = min(1.0, 2.0 / (64 / s.bm + 64 / s.bn)) * s.bk / (s.bk + 4)
    peak = roof["peak_tflops"]
    if _is_matmul(s.spec) and s.spec.dtype == "float32":
        peak = profile.fp32_matmul_tflops(s.config.get("PRECISION", "ieee"))
    seconds = roof["flops"] / (peak * 1e12 * tile_eff * wave_eff)
    return {"wave_eff": wave_eff, "tile_eff": tile_eff, "compute_s": seconds}


def _latency(s: _Shape, waves: int) -> float:
    """Little's law per program: a loop with num_stages buffers keeps num_stages - 1 loads ahead,
    so no step is shorter than latency / (num_stages - 1); programs on one slot run in turn."""
    if not s.loops:
        return 0.0
    return waves * s.steps * DRAM_LATENCY_NS * 1e-9 / max(1, s.num_stages - 1)


def estimate_time(spec: KernelSpec, config: dict, profile: HardwareProfile, resources: dict | None = None) -> dict:
    """Estimated ms of `config` for `spec` on `profile` (a ResourceReport dict sharpens it)."""
    roof = roofline(spec, profile)
    base = {"measured": False, "label": LABEL, "device": profile.name, "ideal_ms": roof["ideal_ms"],
            "bound": roof["bound"], "ms": None}
    s = _Shape(spec, config, family_of(spec))
    res = _resources(resources, profile, s)
    if not res["feasible"]:
        return {**base, "feasible": False, "reason": res["reason"]}

    slots = profile.sms * res["blocks_per_sm"]
    resident = min(s.programs, slots)
    waves = math.ceil(s.programs / slots)
    mem, comp = _memory(s, roof, resident, profile), _compute(s, roof, profile)
    # a persistent grid starts only the resident programs, and fills its pipeline once
    started = resident if s.persistent else s.programs
    schedule_s = started / profile.sms * PROGRAM_START_NS * 1e-9
    fill_s = ((1 if s.persistent else waves) * DRAM_LATENCY_NS * 1e-9) if s.loops else 0.0
    latency_s = _latency(s, waves)
    # every resource works concurrently and the busiest bounds the time; with one stage a loop
    # waits for its loads before each step's math
    overlap = 0.0 if s.loops and s.num_stages == 1 else 1.0
    body_s = (_smooth_max(mem["dram_s"], mem["l2_s"], comp["compute_s"], schedule_s, latency_s)
              + (1.0 - overlap) * min(max(mem["dram_s"], mem["l2_s"]), comp["compute_s"]))
    spill_factor = 1.0 + min(3.0, res["spill_bytes"] / SPILL_PENALTY_BYTES)
    launch_s = res["launches"] * LAUNCH_US * 1e-6
    total_ms = (body_s * spill_factor + fill_s + launch_s) * 1e3
    return {**base, "feasible": True, "reason": "", "ms": total_ms, "efficiency": roof["ideal_ms"] / total_ms,
            "programs": s.programs, "waves": waves, "blocks_per_sm": res["blocks_per_sm"],
            "occupancy": res["occupancy"], "resources_from": res["resources_from"],
            "dram_bytes": mem["dram"], "l2_bytes": mem["l2"],
            "factors": {"wave_efficiency": comp["wave_eff"], "bandwidth_efficiency": mem["bw_eff"],
                        "tile_efficiency": comp["tile_eff"], "overlap": overlap, "spill_factor": spill_factor,
                        "traffic_multiplier": mem["dram"] / roof["bytes"], "dram_ms": mem["dram_s"] * 1e3,
                        "l2_ms": mem["l2_s"] * 1e3, "compute_ms": comp["compute_s"] * 1e3,
                        "schedule_ms": schedule_s * 1e3, "latency_ms": latency_s * 1e3,
                        "fill_us": fill_s * 1e6, "launch_us": launch_s * 1e6}}
