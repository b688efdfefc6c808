"""A small fixture dataset for the policy's tests: records shaped like bench.collect's, with times
made up from the roofline model (kernels.estimate) times a hidden per-knob factor and noise.

Never real measurements: every record says measured=False and device_name FIXTURE_DEVICE, so
`mtmc.policy.train` refuses it without --allow-unmeasured and a checkpoint trained on it says so.
The hidden factor (a fixed, seeded multiplier per (family, knob, value)) gives the cost model
something to learn that the roofline feature alone does not know.
"""
from __future__ import annotations

import math
import random

from bench.collect_specs import all_specs, configs_for, masked
from mtmc.kernels.estimate import estimate_time
from mtmc.policy import dataset
from mtmc.policy.actions import config_key
from mtmc.tools.hardware import PROFILES

FIXTURE_DEVICE = "fixture (roofline model + noise, not measured)"
H200 = PROFILES["h200"]


def _hidden(family: str, knob: str, value) -> float:
    """A seeded multiplier in [0.7, 1.4] per knob value: the part of the 'truth' the roofline lacks."""
    return 0.7 + 0.7 * dataset.unit("fixture", family, knob, value)


def fixture_records(families: list[str], specs_per_family: int = 5, configs_per_spec: int = 24,
                    exhaustive_heldout: int = 60, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    versions = {"torch": None, "triton": None, "python": None, "mtmc_commit": "fixture"}
    for entry in all_specs(families, specs_per_family, seed):
        spec = entry.spec
        for cfg in configs_for(entry, H200, configs_per_spec, exhaustive_heldout, seed):
            why = masked(spec, cfg, H200)
            ms, stage, err = None, "ok", None
            if why:
                stage, err = "masked", why[:300]
            elif rng.random() < 0.04:
                stage, err = "compile_error", "fixture: a made-up compile error"
            else:
                est = estimate_time(spec, cfg, H200)["ms"]
                factor = math.prod(_hidden(spec.family, k, v) for k, v in sorted(cfg.items()))
                ms = est * factor * math.exp(rng.gauss(0.0, 0.03))
            spec_d = {k: v for k, v in spec.to_dict().items() if k != "request"}
            out.append(dataset.Record(
                spec=spec_d, spec_key=spec.key(), family=spec.family, config=cfg, config_key=config_key(cfg),
                resources=dataset.no_resources(), legal=why is None, stage=stage, error=err, ms=ms,
                measured=False, gpu="h200", device_name=FIXTURE_DEVICE, date="2026-01-01",
                versions=versions, run="fixture", set=entry.set).to_dict())
    return out


def write_fixture(folder, families: list[str], **kw) -> list[dict]:
    """Write the fixture through the dataset's own writer; returns its records."""
    records = fixture_records(families, **kw)
    dataset.append(folder / dataset.file_name("2026-01-01", "fixture", "t0"), records)
    return records
