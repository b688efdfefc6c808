"""The baseline macro planner: greedy search over one-knob moves, ranked by the roofline model.

This is an honest stand-in until the RL-trained policy ships: it scores every legal action by
the estimated time of the config it leads to (kernels.estimate), turns the scores into
probabilities with a softmax, and picks the best untried move.  With real timings (a GPU) it
keeps exploring the best-ranked moves until `patience` moves in a row fail to beat the best
measured draft; with estimates only, it stops once no move is predicted to gain 1 %.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from mtmc.kernels.catalog import family_of
from mtmc.kernels.estimate import estimate_time
from mtmc.kernels.spec import KernelSpec
from mtmc.policy.actions import STOP, WHY_KIND, Action, config_key, legal_actions

POLICY_NAME = "baseline: greedy one-knob search ranked by a roofline estimate (not the RL policy)"
TEMPERATURE = 0.05   # in log-time units: a 5 % predicted gain is worth one nat of preference
MIN_GAIN = 0.01


@dataclass
class Decision:
    action: dict
    reason: str
    alternatives: list[dict] = field(default_factory=list)  # label, prob, predicted_ms
    predicted_ms: float | None = None
    policy: str = POLICY_NAME

    def to_dict(self) -> dict:
        return asdict(self)


def _estimate_ms(spec: KernelSpec, config: dict, hw) -> float:
    """Estimated ms; infinite where the resource model says the config cannot run (masked)."""
    ms = estimate_time(spec, config, hw).get("ms")
    return float(ms) if ms is not None else math.inf


def rank(spec: KernelSpec, config: dict, hw, tried: set[str]) -> tuple[float, list[tuple[Action, float]]]:
    """Current estimate and the untried legal moves with their estimates, best first."""
    space = family_of(spec).config_space(spec)
    current = _estimate_ms(spec, config, hw)
    scored = []
    for action in legal_actions(space, config):
        new = action.apply(config)
        if config_key(new) in tried:
            continue
        ms = _estimate_ms(spec, new, hw)
        if math.isfinite(ms):  # mask moves the resource model rules out
            scored.append((action, ms))
    scored.sort(key=lambda p: p[1])
    return current, scored


def _probabilities(current_ms: float, scored: list[tuple[Action, float]]) -> list[tuple[Action, float, float]]:
    options = [(STOP, current_ms)] + scored
    logits = [-math.log(max(ms, 1e-9)) / TEMPERATURE for _, ms in options]
    top = max(logits)
    weights = [math.exp(l - top) for l in logits]
    total = sum(weights)
    out = [(a, w / total, ms) for (a, ms), w in zip(options, weights)]
    out.sort(key=lambda t: -t[1])
    return out


def decide(spec: KernelSpec, config: dict, hw, *, tried: set[str], measured: bool,
           steps_taken: int, max_steps: int, stale_steps: int, patience: int = 3,
           top_k: int = 5) -> Decision:
    current_ms, scored = rank(spec, config, hw, tried)
    options = _probabilities(current_ms, scored)
    alternatives = [{"action": a.label(), "kind": a.kind, "prob": round(p, 4), "predicted_ms": ms}
                    for a, p, ms in options[:top_k]]

    def stop(reason: str) -> Decision:
        return Decision(STOP.to_dict(), reason, alternatives, current_ms)

    if steps_taken >= max_steps:
        return stop(f"step budget of {max_steps} used")
    if not scored:
        return stop("every legal one-knob move from the best draft has been tried")
    best_action, best_ms = scored[0]
    gain = 1.0 - best_ms / current_ms if current_ms > 0 else 0.0
    if measured and stale_steps >= patience:
        return stop(f"{stale_steps} measured moves in a row did not beat the best draft")
    if not measured and gain < MIN_GAIN:
        return stop(f"no move is predicted to gain {MIN_GAIN:.0%} (best: {best_action.label()}, "
                    f"{gain:+.1%}); without a GPU the estimate cannot justify more steps")
    why = WHY_KIND.get(best_action.kind, "")
    verb = "predicted" if gain >= 0 else "explored despite a predicted"
    reason = (f"{best_action.label()}: {verb} {best_ms:.4f} ms vs {current_ms:.4f} ms now "
              f"({gain:+.1%}); {why}")
    return Decision(best_action.to_dict(), reason, alternatives, best_ms)
