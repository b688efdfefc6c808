"""The graph stage's algebraic rewrites: between capture and the fusion groups, every change to
the captured graph is a recorded macro action with its legality reason and predicted effect.

Rules (each a module with `candidates(desc) -> list[records.Candidate]`, one per place it looked
at: legal with the edited graph, or refused with the reason):
  reductions  a sum / mean after a linear map (nn.Linear, F.linear, x @ W, a conv or conv
              transpose) moved before it, through the affine ops between (a GEMM becomes a GEMV;
              a conv becomes a one-channel conv; over a conv's positions, tap-window sums of its
              input and a smaller conv or a GEMM: conv_positions)
  batchnorm   an eval-mode BatchNorm folded into the preceding conv / linear weights at run time
              (refused in training mode: batch statistics)
  simplify    identities removed: softmax over a dim of size 1, reductions over singleton dims,
              x * 1, x + 0, transposes / permutes that cancel, reshapes to the same shape
  dead_code   a value nothing reads removed, with the pure nodes that only fed it

`run(captured)` applies, one at a time, the legal candidate with the largest predicted gain (a
roofline estimate from the shapes, on the H200 profile unless told) while one has a gain above
zero, and records each choice as a StageDecision with the alternatives it weighed; refusals are
kept with their reasons.  The edited graphs replace the captured ones for the partitioner and the
assembler (ModelNew's forward is the edited graph); the whole-module guard proves the result
against the float64 Model, and a ModelNew that fails it is written again from the graph as
captured (agents.module_steps).
"""
from __future__ import annotations

from mtmc.module.graph_stage import batchnorm, dead_code, reductions, simplify
from mtmc.module.graph_stage.records import Candidate, StageDecision
from mtmc.tools.hardware import HardwareProfile, get_profile

RULES = (reductions, batchnorm, simplify, dead_code)
MAX_REWRITES = 32   # per graph


def candidates(desc: dict) -> list[Candidate]:
    """Every candidate rewrite of one captured graph, legal or refused (the planner's list)."""
    return [c for rule in RULES for c in rule.candidates(desc)]


def _alternative(c: Candidate, hw: HardwareProfile) -> dict:
    gain = c.gain_ms(hw)
    return {"label": c.label(), "rule": c.rule, "legal": c.legal, "predicted_gain_ms": gain, "reason": c.reason}


def rewrite_graph(desc: dict, hw: HardwareProfile) -> tuple[dict, list[dict], list[dict], list[dict]]:
    """(the edited graph, applied candidates, refused or unprofitable ones, decisions)."""
    applied, decisions = [], []
    skipped: dict[tuple, dict] = {}
    for _ in range(MAX_REWRITES):
        found = candidates(desc)
        for c in found:
            if not c.legal:
                skipped.setdefault((c.rule, c.node, c.reason), {**c.to_dict(hw), "status": "refused"})
        legal = sorted((c for c in found if c.legal), key=lambda c: -(c.gain_ms(hw) or 0.0))
        alternatives = [_alternative(c, hw) for c in legal + [c for c in found if not c.legal]]
        best = next((c for c in legal if (c.gain_ms(hw) or 0.0) > 0), None)
        if best is None:
            for c in legal:
                skipped.setdefault((c.rule, c.node, "gain"), {**c.to_dict(hw), "status": "not applied",
                                                              "why_not": "predicted gain is not above zero"})
            decisions.append(StageDecision({"kind": "stop", "graph": desc.get("path", "")},
                                           "no legal rewrite left with a predicted gain above zero",
                                           alternatives).to_dict())
            break
        gain = best.gain_ms(hw)
        decisions.append(StageDecision({"kind": "rewrite", "rule": best.rule, "node": best.node,
                                        "graph": best.graph}, best.reason, alternatives, gain).to_dict())
        applied.append({**best.to_dict(hw), "status": "applied", "measured": None})
        desc = {**best.apply, "rewritten": True}
    done = {(a["rule"], a["node"]) for a in applied}
    return desc, applied, [s for s in skipped.values() if (s["rule"], s["node"]) not in done], decisions


def run(captured: dict, hw: HardwareProfile | None = None) -> dict:
    """{"captured": the capture with its graphs rewritten, "applied", "refused", "decisions"}."""
    hw = hw or get_profile("h200")
    graphs, applied, refused, decisions = [], [], [], []
    for desc in captured["graphs"]:
        new, a, r, d = rewrite_graph(desc, hw)
        graphs.append(new)
        applied += a
        refused += r
        decisions += d
    out = {**captured, "graphs": graphs} if applied else captured
    return {"captured": out, "applied": applied, "refused": refused, "decisions": decisions,
            "hardware": hw.name}
