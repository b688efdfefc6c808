"""State features of the macro policy: (spec, config, hardware) as fixed-length float vectors.

One network covers every family, so every family's spec and config land in the same slots:
  spec:     family one-hot, op one-hot, dtype one-hot, per dim name [present, log2 size,
            divisible by 16, by 128, a power of two], log10 flops and bytes, log2 arithmetic
            intensity, log of the roofline's ideal ms, memory-bound, tensor cores;
  config:   per knob [present, value] encoded by the knob's kind (numbers as log2(v + 1),
            switches as 0/1, named choices one-hot);
  model:    the resource model's and roofline's view of the config (kernels.estimate): feasible,
            log(estimate / ideal), programs, waves, blocks per SM, occupancy, its efficiency
            factors and which resource dominates (the cost model learns a correction to it);
  compiled: registers, spills, shared memory and occupancy of the sm_90 compile where known,
            with a flag, else zeros (the planner rarely knows a candidate's compile);
  hardware: SMs, shared memory, registers, L2, bandwidth and the dtype's peak.
Which families, ops, dims and knobs get slots is the `Layout`, fixed when a model is trained
(from the catalog and the data) and stored in its checkpoint, so features mean the same at
planning time; a knob or dim the layout lacks is dropped (the checkpoint predates it).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from mtmc.kernels.catalog import family_of
from mtmc.kernels.estimate import estimate_time, roofline
from mtmc.kernels.spec import DTYPES, KernelSpec
from mtmc.tools.hardware import HardwareProfile

FACTOR_KEYS = ("wave_efficiency", "bandwidth_efficiency", "tile_efficiency", "overlap")
TIME_PARTS = ("dram_ms", "l2_ms", "compute_ms", "schedule_ms", "latency_ms")
ROOF_SIZE, HW_SIZE = 6, 7   # spec_vector's roofline part and hw_vector's length


def _log2(x: float) -> float:
    return math.log2(max(float(x), 1e-30))


@dataclass
class Layout:
    """Which slots a feature vector has (stored in a checkpoint)."""
    families: list[str]
    ops: list[str]
    dims: list[str]
    knobs: dict[str, dict] = field(default_factory=dict)   # name -> {"kind": num|bool|cat, "values": [...]}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Layout":
        return cls(list(d["families"]), list(d["ops"]), list(d["dims"]), dict(d["knobs"]))

    @classmethod
    def build(cls, specs: list[KernelSpec], configs: list[dict]) -> "Layout":
        """Slots for every family in the catalog and every op, dim and knob of `specs` / `configs`
        and of the specs' config spaces."""
        from mtmc.kernels.catalog import families
        values: dict[str, list] = {}
        for spec in specs:
            for k, vs in family_of(spec).config_space(spec).items():
                values.setdefault(k, []).extend(vs)
        for cfg in configs:
            for k, v in cfg.items():
                values.setdefault(k, []).append(v)
        knobs = {}
        for k in sorted(values):
            vs = values[k]
            if all(isinstance(v, bool) for v in vs):
                knobs[k] = {"kind": "bool", "values": []}
            elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vs):
                knobs[k] = {"kind": "num", "values": []}
            else:
                knobs[k] = {"kind": "cat", "values": sorted({str(v) for v in vs})}
        return cls(sorted(families()), sorted({s.op for s in specs}), sorted({d for s in specs for d in s.dims}),
                   knobs)

    # -- sizes ------------------------------------------------------------------------------
    def knob_width(self, name: str) -> int:
        k = self.knobs[name]
        return 1 + (len(k["values"]) if k["kind"] == "cat" else 1)

    @property
    def spec_size(self) -> int:
        return len(self.families) + len(self.ops) + len(DTYPES) + 5 * len(self.dims) + ROOF_SIZE + HW_SIZE

    @property
    def config_size(self) -> int:
        return sum(self.knob_width(k) for k in self.knobs)


def hw_vector(hw: HardwareProfile, dtype: str, tensor_core: bool) -> list[float]:
    return [hw.sms / 100.0, _log2(hw.smem_per_block) - 17, _log2(hw.regs_per_sm) - 16, _log2(max(hw.l2_bytes, 1)) - 25,
            _log2(hw.bandwidth_gbs) - 12, _log2(hw.peak_tflops(dtype, tensor_core)) - 7, hw.arch / 100.0]


def spec_vector(spec: KernelSpec, hw: HardwareProfile, layout: Layout) -> list[float]:
    v = [float(spec.family == f) for f in layout.families]
    v += [float(spec.op == o) for o in layout.ops]
    v += [float(spec.dtype == d) for d in DTYPES]
    for name in layout.dims:
        size = spec.dims.get(name)
        if size is None:
            v += [0.0] * 5
        else:
            v += [1.0, _log2(size + 1) / 10.0, float(size % 16 == 0), float(size % 128 == 0),
                  float(size & (size - 1) == 0)]
    roof = roofline(spec, hw)
    v += [math.log10(max(roof["flops"], 1.0)) / 10.0, math.log10(max(roof["bytes"], 1.0)) / 10.0,
          _log2(min(roof["intensity"], 1e6)) / 10.0, math.log(max(roof["ideal_ms"], 1e-9)) / 5.0,
          float(roof["bound"] == "memory"), float(roof["tensor_core"])]
    return v + hw_vector(hw, spec.dtype, roof["tensor_core"])


def config_vector(config: dict, layout: Layout) -> list[float]:
    v: list[float] = []
    for name, k in layout.knobs.items():
        val = config.get(name)
        if val is None:
            v += [0.0] * layout.knob_width(name)
        elif k["kind"] == "bool":
            v += [1.0, float(bool(val))]
        elif k["kind"] == "num":
            v += [1.0, _log2(float(val) + 1) / 8.0]
        else:
            v += [1.0] + [float(str(val) == c) for c in k["values"]]
    return v


MODEL_SIZE = 9 + len(FACTOR_KEYS) + len(TIME_PARTS) + 5


def model_vector(spec: KernelSpec, config: dict, hw: HardwareProfile, resources: dict | None = None) -> tuple[list[float], dict]:
    """The resource model's and roofline's features of the config, the compiled resources' (where
    given: the dataset's {regs, spills, smem, threads, occupancy}), and the estimate itself."""
    try:
        est = estimate_time(spec, config, hw)
    except Exception:   # the model cannot read this config: nothing known
        est = {"feasible": False, "ms": None, "ideal_ms": None}
    ideal = est.get("ideal_ms") or 1e-6
    if est.get("ms") is not None:
        f = est["factors"]
        v = [1.0, math.log(est["ms"] / ideal), _log2(est["programs"] + 1) / 20.0, _log2(est["waves"] + 1) / 10.0,
             est["blocks_per_sm"] / 16.0, est["occupancy"], math.log(f["spill_factor"]),
             math.log(max(f["traffic_multiplier"], 1e-6)), f["launch_us"] * 1e-3 / est["ms"]]
        v += [float(f[k]) for k in FACTOR_KEYS]
        v += [f[k] / est["ms"] for k in TIME_PARTS]
    else:
        v = [0.0] * (9 + len(FACTOR_KEYS) + len(TIME_PARTS))
    r = resources or {}
    if r.get("regs") is not None:
        v += [1.0, r["regs"] / 255.0, _log2((r.get("spills") or 0) + 1) / 10.0,
              (r.get("smem") or 0) / max(hw.smem_per_block, 1), float(r.get("occupancy") or 0.0)]
    else:
        v += [0.0] * 5
    return v, est


def features(spec: KernelSpec, config: dict, hw: HardwareProfile, layout: Layout,
             resources: dict | None = None, spec_vec: list[float] | None = None) -> tuple[list[float], dict]:
    """The whole vector of (spec, config, hw) and the resource model's estimate (its "ms" None
    where the model rules the config out).  `spec_vec` reuses a spec's part across its configs."""
    mv, est = model_vector(spec, config, hw, resources)
    sv = spec_vec if spec_vec is not None else spec_vector(spec, hw, layout)
    return sv + config_vector(config, layout) + mv, est


def feature_size(layout: Layout) -> int:
    return layout.spec_size + layout.config_size + MODEL_SIZE

