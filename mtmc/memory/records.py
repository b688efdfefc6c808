"""One optimization history as plain data, and the measures used to compare histories.

A record is what the memory keeps of a finished run: the spec, the GPU profile it was tuned for,
the software versions, every step (action, alternatives with probabilities, reason, diff,
verdict), the final config and kernel source, and the times.  It is JSON on disk (the log) and
a short description plus flat metadata in the index.
"""
from __future__ import annotations

import functools
import json
import math
import shutil
import subprocess
import uuid
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone

VERSION_KEYS = ("torch", "triton", "cuda", "driver")


@dataclass
class HistoryRecord:
    id: str
    created: str                    # ISO-8601, UTC
    request: str                    # the words (or module group) the run served
    spec: dict                      # KernelSpec.to_dict()
    gpu: dict                       # HardwareProfile.to_dict() of the target it was tuned for
    versions: dict                  # torch, triton, cuda, driver ("none" where absent)
    steps: list[dict]               # the graph's step records, diffs included
    final_config: dict
    final_step: int                 # the step that produced the final config
    source: str                     # the final kernel source
    time_ms: float | None
    measured: bool                  # False: time_ms is a roofline estimate
    baselines: dict = field(default_factory=dict)   # eager_ms / compile_ms when measured
    speedups: dict = field(default_factory=dict)    # eager / compile / over_first_draft
    stop: dict | None = None        # the planner's closing decision (why it stopped)
    warm_start: str | None = None   # id of the history the first draft came from
    llm_calls: list = field(default_factory=list)   # the chat model's calls per role: latency, tokens

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "HistoryRecord":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @property
    def gpu_name(self) -> str:
        return self.gpu.get("name", "")

    def description(self) -> str:
        """What the embedding sees: the spec in words, then the request as asked."""
        text = describe_spec(self.spec)
        request = self.request or self.spec.get("request", "")
        return f"{text}. Request: {request}" if request and request != text else text

    def metadata(self) -> dict:
        """Flat fields for Chroma's metadata filters (the structured part of similarity)."""
        s = self.spec
        return {"family": s["family"], "op": s["op"], "dtype": s.get("dtype", "float32"),
                "gpu": self.gpu_name, "shape_bucket": shape_bucket(s["dims"]),
                "dims": json.dumps(s["dims"], sort_keys=True), "created": self.created,
                "measured": bool(self.measured), "final_step": int(self.final_step)}

    def summary(self, gpu_name: str | None = None) -> dict:
        """The light form the graph state and listings carry (no source, no diffs)."""
        reasons = stale_reasons(self.versions, current_versions())
        if gpu_name and self.gpu_name != gpu_name:
            reasons.append(f"GPU {self.gpu_name} -> {gpu_name}")
        return {"id": self.id, "description": describe_spec(self.spec), "request": self.request,
                "family": self.spec["family"], "op": self.spec["op"], "dtype": self.spec.get("dtype"),
                "dims": self.spec["dims"], "gpu": self.gpu_name, "final_config": self.final_config,
                "final_step": self.final_step, "drafts": len(self.steps), "time_ms": self.time_ms,
                "measured": self.measured, "speedups": self.speedups, "created": self.created,
                "versions": self.versions, "stale": bool(reasons), "stale_reasons": reasons}

    def as_state(self) -> dict:
        """The graph-state shape the explainer reads, so old decisions can be explained too."""
        best = next((s for s in self.steps if s.get("step") == self.final_step), {})
        return {"spec": self.spec, "steps": self.steps, "decision": self.stop or {}, "history_id": self.id,
                "gpu": self.gpu,
                "best": {**best, "config": self.final_config, "source": self.source, "time_ms": self.time_ms}}


def new_id(spec: dict) -> str:
    """Readable and unique: family, UTC time, random suffix."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{spec['family']}-{stamp}-{uuid.uuid4().hex[:6]}"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def describe_spec(spec: dict) -> str:
    from mtmc.kernels.catalog import describe
    from mtmc.kernels.spec import KernelSpec
    try:
        return describe(KernelSpec.from_dict(spec))
    except ValueError:  # a family this version no longer has: still say what it was
        dims = "x".join(str(v) for v in spec["dims"].values())
        return f"{spec['op']} ({spec['family']}) {dims} {spec.get('dtype', '')}"


def shape_bucket(dims: dict) -> int:
    """log2 of the element count of the iteration space, rounded: a coarse size class."""
    return round(sum(math.log2(max(1, int(v))) for v in dims.values()))


MISSING_DIM = 8.0  # a dim one spec has and the other lacks counts like a 256x size gap


def shape_distance(a: dict, b: dict) -> float:
    """Sum over dims of |log2 ratio|: 2x on one axis costs 1, whichever axis it is."""
    return sum(abs(math.log2(max(1, int(a[k]))) - math.log2(max(1, int(b[k])))) if k in a and k in b
               else MISSING_DIM for k in set(a) | set(b))


@functools.lru_cache(maxsize=1)
def current_versions() -> dict:
    """The versions results here are produced with; a record made under others is stale."""
    import torch
    import triton
    return {"torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda or "none", "driver": _driver_version()}


def _driver_version() -> str:
    if not shutil.which("nvidia-smi"):
        return "none"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return "none"
    return out[0] if out else "none"


def stale_reasons(recorded: dict, current: dict) -> list[str]:
    return [f"{k} {recorded.get(k, 'unknown')} -> {current[k]}" for k in VERSION_KEYS
            if recorded.get(k) != current.get(k)]
