"""The learned macro planner: the RL-trained policy ranks the legal moves, the cost model prices them.

`decide` has baseline.decide's signature (plus optional facts the agent's state has: the best
draft's measured time and compile report, the last verdict) and returns the same `Decision`.
The legal one-knob moves of the best config, minus configs already tried and configs the resource
model rules out on the target hardware, plus stop, are scored by the policy network
(policy.network); its masked softmax gives the probabilities recorded for every alternative,
beside the cost model's predicted time, gain and validity for the config each leads to.  The
pick is the policy's most probable action (deterministic: the same state gives the same plan).
Every predicted number is labelled a model prediction; only the verdicts measure.

Loop rules that are not the policy's stay as in the baseline: the step budget, nothing left to
try, and, with real timings, `patience` moves in a row that did not beat the best.

The checkpoint (python -m mtmc.policy.train) is loaded once per process (cached by path and
modification time; MTMC_POLICY_CHECKPOINT names another file).  Without one, or for a family
the checkpoint was not trained on, `decide` falls back to baseline.decide and says so in the reason.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from mtmc.kernels.spec import KernelSpec
from mtmc.policy import baseline
from mtmc.policy.actions import STOP, WHY_KIND, config_key
from mtmc.policy.baseline import Decision
from mtmc.policy.env import SpecWorld, action_vector, state_vector
from mtmc.policy.network import pad

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "policy.pt"
PREDICTION = "cost-model prediction, not a measurement"


@dataclass
class Loaded:
    path: str
    cost: object          # policy.cost_model.CostModel
    net: object           # policy.network.ActorCritic
    reward: object        # policy.env.RewardConfig
    meta: dict

    @property
    def name(self) -> str:
        d = self.meta.get("data") or {}
        measured = "measured" if self.meta.get("measured_only") else "NOT all measured (fixture or interpreter)"
        return (f"learned: PPO actor-critic in a learned cost model, trained {str(self.meta.get('trained', '?'))[:10]} "
                f"on {self.meta.get('used_records', '?')} records ({measured}) of {d.get('specs', '?')} specs "
                f"from {', '.join(d.get('devices') or ['?'])}")


_CACHE: dict[str, tuple[float, Loaded]] = {}


def checkpoint_path() -> Path:
    return Path(os.environ.get("MTMC_POLICY_CHECKPOINT") or DEFAULT_CHECKPOINT)


def load_policy(path: str | os.PathLike | None = None) -> Loaded | None:
    """The checkpoint at `path` (default: checkpoint_path()), loaded once; None if there is none."""
    from mtmc.policy.train import load
    p = Path(path) if path else checkpoint_path()
    try:
        mtime = p.stat().st_mtime
    except OSError:
        return None
    hit = _CACHE.get(str(p))
    if hit and hit[0] == mtime:
        return hit[1]
    cost, net, reward, meta = load(p)
    loaded = Loaded(str(p), cost, net, reward, meta)
    _CACHE[str(p)] = (mtime, loaded)
    return loaded


class _one_thread:
    """Score on one thread: the matrices are tiny, and on a busy machine torch's thread pool costs
    more than it saves (tens of ms)."""

    def __enter__(self):
        self.n = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.n)


def score(loaded: Loaded, spec: KernelSpec, config: dict, hw, *, tried: set[str], steps_taken: int,
          max_steps: int, current_ms: float | None = None, last_verdict: str = "start",
          resources: dict | None = None):
    """(world, candidates, probabilities [1 + len(candidates)], current prediction): index 0 is stop."""
    world = SpecWorld(spec, hw, loaded.cost)
    cands = world.candidates(config, set(tried) | {config_key(config)})
    s = state_vector(world, config, current_ms, steps_taken, max_steps, last_verdict, len(cands), resources)
    acts = [action_vector(world, config, None)] + [action_vector(world, config, c) for c in cands]
    a, mask = pad([acts], loaded.net.action_dim)
    with torch.no_grad(), _one_thread():
        logits, _ = loaded.net(torch.tensor([s], dtype=torch.float32), a, mask)
        probs = torch.softmax(logits[0], -1)
    return world, cands, probs, world.predict([config])[0]


def decide(spec: KernelSpec, config: dict, hw, *, tried: set[str], measured: bool, steps_taken: int,
           max_steps: int, stale_steps: int, patience: int = 3, top_k: int = 5,
           current_ms: float | None = None, last_verdict: str | None = None, resources: dict | None = None,
           checkpoint: str | os.PathLike | None = None) -> Decision:
    """The next move for the best draft `config`, or stop (see the module doc).  current_ms: the
    best draft's measured time (None without a GPU: the cost model's prediction stands in)."""
    def fallback(why: str) -> Decision:
        d = baseline.decide(spec, config, hw, tried=tried, measured=measured, steps_taken=steps_taken,
                            max_steps=max_steps, stale_steps=stale_steps, patience=patience, top_k=top_k)
        d.reason = f"baseline planner ({why}): {d.reason}"
        return d

    try:
        loaded = load_policy(checkpoint)
    except Exception as e:   # a damaged or incompatible checkpoint must not stop the run
        return fallback(f"the policy checkpoint could not be loaded: {type(e).__name__}: {str(e)[:200]}")
    if loaded is None:
        return fallback(f"no policy checkpoint at {checkpoint or checkpoint_path()}")
    if spec.family not in loaded.cost.layout.families or spec.family not in loaded.meta.get("families", []):
        return fallback(f"the policy was not trained on the {spec.family} family")
    world, cands, probs, cur = score(loaded, spec, config, hw, tried=tried, steps_taken=steps_taken,
                                     max_steps=max_steps, current_ms=current_ms if measured else None,
                                     last_verdict=last_verdict or "start", resources=resources)
    options = [(STOP, float(probs[0]), cur)] + [(c.action, float(probs[i + 1]), c.pred) for i, c in enumerate(cands)]
    options.sort(key=lambda t: -t[1])
    alternatives = [{"action": a.label(), "kind": a.kind, "prob": round(p, 4), "predicted_ms": pred["ms"],
                     "predicted_gain": round(1.0 - pred["ms"] / cur["ms"], 4),
                     "p_valid": round(pred["p_valid"], 3), "source": PREDICTION}
                    for a, p, pred in options[:top_k]]

    def stop(reason: str) -> Decision:
        return Decision(STOP.to_dict(), reason, alternatives, cur["ms"], loaded.name)

    if steps_taken >= max_steps:
        return stop(f"step budget of {max_steps} used")
    if not cands:
        return stop("every legal one-knob move from the best draft has been tried or is ruled out by the "
                    "resource model")
    if measured and stale_steps >= patience:
        return stop(f"{stale_steps} measured moves in a row did not beat the best draft")
    action, p, pred = options[0]
    moves = [o for o in options if o[0].kind != "stop"]
    if action.kind == "stop":
        m_action, m_p, m_pred = moves[0]
        return stop(f"the policy stops (p={p:.2f}); its likeliest move {m_action.label()} (p={m_p:.2f}) is "
                    f"predicted {m_pred['ms']:.4f} ms vs {cur['ms']:.4f} ms now "
                    f"({1 - m_pred['ms'] / cur['ms']:+.1%}, {PREDICTION})")
    gain = 1.0 - pred["ms"] / cur["ms"]
    now = f"{current_ms:.4f} ms measured, {cur['ms']:.4f} ms predicted" if measured and current_ms else \
        f"{cur['ms']:.4f} ms"
    reason = (f"{action.label()}: the policy's choice (p={p:.2f}); predicted {pred['ms']:.4f} ms vs {now} now "
              f"({gain:+.1%}, validity {pred['p_valid']:.2f}; {PREDICTION}); {WHY_KIND.get(action.kind, '')}")
    return Decision(action.to_dict(), reason, alternatives, pred["ms"], loaded.name)

