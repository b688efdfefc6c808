"""What the graph stage records: each candidate rewrite (applied or refused, with its reason),
its predicted effect from the shapes (flops, bytes and a roofline time before and after), and the
stage's decisions, each with the alternatives it weighed (as the kernel planner's Decision
records do, mtmc.policy.baseline).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mtmc.tools.hardware import HardwareProfile, get_profile

LAUNCH_MS = 0.004   # a kernel launch on the GPU, for the predicted effect of changing their number


@dataclass
class Work:
    """Work of a piece of the graph: flops, bytes moved to and from memory, kernel launches."""
    flops: float = 0.0
    bytes: float = 0.0
    launches: int = 0

    def __add__(self, other: "Work") -> "Work":
        return Work(self.flops + other.flops, self.bytes + other.bytes, self.launches + other.launches)

    def ms(self, hw: HardwareProfile, dtype: str = "float32") -> float:
        """Roofline time: the slower of compute and memory, plus the launches."""
        peak = hw.fp32_tflops if dtype in ("float32", "float64") else hw.tc_tflops.get(dtype, hw.fp32_tflops)
        return max(self.flops / (peak * 1e12), self.bytes / (hw.bandwidth_gbs * 1e9)) * 1e3 + self.launches * LAUNCH_MS

    def to_dict(self, hw: HardwareProfile, dtype: str = "float32") -> dict:
        return {"flops": self.flops, "bytes": self.bytes, "launches": self.launches, "ms": self.ms(hw, dtype)}


@dataclass
class Candidate:
    """One rewrite the stage could make at one place of the graph.

    rule:     which rewrite (e.g. "reduction_before_linear", "fold_batchnorm", "identity")
    node:     the captured node it starts from; graph: the captured graph's path
    legal:    whether it may be applied; reason: why it is legal (what makes it exact) or why not
    ops:      the nodes it replaces, in words; result: what it becomes, in words
    before / after: the work of the replaced nodes and of what replaces them (from the shapes)
    apply:    the edited graph description (legal candidates only; not recorded)
    """
    rule: str
    node: str
    graph: str
    legal: bool
    reason: str
    ops: list[str] = field(default_factory=list)
    result: str = ""
    before: Work | None = None
    after: Work | None = None
    dtype: str = "float32"
    apply: dict | None = None

    def gain_ms(self, hw: HardwareProfile) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.before.ms(hw, self.dtype) - self.after.ms(hw, self.dtype)

    def label(self) -> str:
        return f"{self.rule} at {self.node}" + (f" in {self.graph}" if self.graph else "")

    def to_dict(self, hw: HardwareProfile | None = None) -> dict:
        hw = hw or get_profile("h200")
        d = {k: v for k, v in asdict(self).items() if k not in ("apply", "before", "after")}
        if self.before is not None and self.after is not None:
            d["predicted"] = {"before": self.before.to_dict(hw, self.dtype), "after": self.after.to_dict(hw, self.dtype),
                              "gain_ms": self.gain_ms(hw), "hardware": hw.name}
        return d


@dataclass
class StageDecision:
    """One choice of the graph stage: the rewrite applied (or stop), why, and what else was weighed."""
    action: dict                       # {"kind": "rewrite", "rule", "node", "graph"} or {"kind": "stop"}
    reason: str
    alternatives: list[dict] = field(default_factory=list)   # label, legal, predicted_gain_ms, reason
    predicted_gain_ms: float | None = None
    policy: str = "graph-stage greedy (roofline gain > 0)"

    def to_dict(self) -> dict:
        return asdict(self)
