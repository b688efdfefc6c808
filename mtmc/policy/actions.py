"""The macro action space: one typed, parameterized change to a draft's config.

An action sets one knob of the family's config space to a neighbouring legal value (tiles,
warps and stages move one step up or down their ladder; switches flip), or stops.  The legal
actions are derived from `Family.config_space`, so every family gets the same vocabulary.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

# Knob name -> the macro decision it expresses (the paper's action types).
KNOB_KIND = {
    "BLOCK_M": "tile", "BLOCK_N": "tile", "BLOCK_K": "tile", "BLOCK": "tile",
    "num_warps": "warps", "num_stages": "pipeline", "GROUP_M": "swizzle",
    "SPLIT_K": "split_k", "PERSISTENT": "persistent", "ROWS_PER_PROG": "rows_per_program",
    "ALGO": "algorithm", "LAYOUT": "layout", "PRECISION": "precision",
    "BLOCK_P": "tile", "BLOCK_R": "tile", "BLOCK_W": "tile", "UNROLL": "unroll",
    # the norm family's split template: statistics tile, programs per statistic, normalize pass
    "BLOCK_T": "tile", "BLOCK_Q": "tile", "NORM_BLOCK": "tile", "norm_warps": "warps",
}

WHY_KIND = {
    "tile": "tile size trades data reuse against registers / shared memory and parallelism",
    "warps": "more warps hide latency and spread a tile over more threads (fewer registers each)",
    "pipeline": "more stages overlap loads with compute at the cost of shared memory",
    "swizzle": "grouping programs along M keeps tiles of B in L2 for longer",
    "split_k": "splitting K adds parallelism when M x N gives too few tiles for the SMs",
    "persistent": "a persistent grid removes launch and tail cost of many small programs",
    "rows_per_program": "several rows per program amortize per-program overhead for short rows",
    "algorithm": "how a conv walks its reduction: taps then channel blocks, flattened (channel, tap) "
                 "blocks for few channels, or a direct multiply-add per channel for depthwise convs; "
                 "a global pool: per-output windows, or lanes along the whole plane",
    "layout": "channels-last input and weights make the reduction dim contiguous (vector loads) "
              "at the cost of a copy",
    "precision": "three TF32 tensor-core products per fp32 product keep fp32 accuracy at several times "
                 "the throughput of IEEE FMAs",
    "unroll": "unrolled taps keep a pooling window's loads in flight together; a loop keeps big windows small",
    "split": "splitting each statistic over several programs (partial sums merged after) fills the GPU when "
             "there are few, long statistics",
    "stop": "no legal change is predicted to help",
}


@dataclass(frozen=True)
class Action:
    kind: str              # a KNOB_KIND value, or "stop"
    knob: str | None = None
    value: Any = None

    def apply(self, config: dict) -> dict:
        if self.kind == "stop":
            return dict(config)
        return {**config, self.knob: self.value}

    def label(self) -> str:
        return "stop" if self.kind == "stop" else f"{self.knob}={self.value}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Action":
        return cls(d["kind"], d.get("knob"), d.get("value"))


STOP = Action("stop")


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def legal_actions(space: dict[str, list], config: dict) -> list[Action]:
    """Every one-knob move to a neighbouring legal value (both directions), in a stable order."""
    actions = []
    for knob, values in space.items():
        if knob not in config:
            continue
        current = config[knob]
        if current in values:
            i = values.index(current)
            neighbours = [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)]
        else:  # off the ladder (e.g. an imported config): any legal value is one move away
            neighbours = list(values)
        for v in neighbours:
            actions.append(Action(KNOB_KIND.get(knob, "knob"), knob, v))
    return actions


def diff_actions(old: dict, new: dict) -> list[Action]:
    """The knob moves that turn config `old` into `new` (used to warm-start from memory)."""
    return [Action(KNOB_KIND.get(k, "knob"), k, v) for k, v in new.items() if old.get(k) != v]
