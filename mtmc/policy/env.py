"""The model-based environment the policy is trained in: the planner's loop with the GPU replaced
by the dataset where it measured and the learned cost model elsewhere.

An episode is one spec on one GPU, as the agent's loop runs it: the first draft is the family's
default config (or, like a warm start from memory, another measured config of the spec); each
step is one legal one-knob move from the best draft so far, or stop.
  state:   (spec, best config, its time, steps taken, the last verdict); `state_vector` encodes it;
  actions: policy.actions.legal_actions of the best config, minus configs already tried, minus
           configs the resource model (kernels.estimate) says cannot run on this hardware (masked:
           the policy never sees them), plus STOP; `action_matrix` encodes each move relative to
           the current config (its knob, direction, and the cost model's predicted gain,
           uncertainty and validity for the config it leads to);
  outcome: a measured config of the spec gives its recorded stage and time; any other the cost
           model's: ok when its validity is >= 0.5, else a compile error, and its predicted time
           made pessimistic by `uncertainty_cost` x the ensemble's spread (the policy must not
           learn to chase the model's errors);
  reward:  +0.1 if the draft compiles, +0.3 if it is correct, + log(speedup over the draft it was
           made from; clipped to [-1, 3]), minus `step_cost` per move.  The step cost is larger
           than the two bonuses together on purpose: with a small one a policy gains 0.4 from every
           correct move that changes nothing and never learns to stop, so a correct move that does
           not speed up nets -(step_cost - 0.4) (0.02 by default: the small cost per step), a failed
           one -step_cost (or -(step_cost - 0.1));
  end:     at stop, when the step budget is used, or when no legal untried move is left.
A slower or failed draft is not kept (the agent rolls back to the best), so the state's config is
always the best so far, as agents.planner sees it.
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field

from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.policy.actions import KNOB_KIND, Action, config_key, legal_actions
from mtmc.policy.cost_model import CostModel, profile_of
from mtmc.policy.features import config_vector, model_vector, spec_vector
from mtmc.tools.hardware import HardwareProfile

VERDICTS = ("start", "faster", "slower", "wrong", "compile_error")
KINDS = sorted(set(KNOB_KIND.values()) | {"knob", "stop"})
GAIN_CLIP = 3.0


@dataclass
class RewardConfig:
    compile_bonus: float = 0.1
    correct_bonus: float = 0.3
    step_cost: float = 0.42
    uncertainty_cost: float = 0.5   # log units of pessimism per unit of the ensemble's spread
    max_steps: int = 8

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Candidate:
    action: Action
    config: dict
    key: str
    pred: dict            # the cost model's prediction (CostModel.predict) for `config`


class SpecWorld:
    """One spec on one GPU: its config space, its measured records, cached predictions."""

    def __init__(self, spec: KernelSpec, hw: HardwareProfile, model: CostModel, measured: dict | None = None):
        self.spec, self.hw, self.model = spec, hw, model
        self.family = family_of(spec)
        self.space = self.family.config_space(spec)
        self.measured = measured or {}           # config_key -> record
        self.spec_vec = spec_vector(spec, hw, model.layout)
        self._pred: dict[str, dict] = {}

    def predict(self, configs: list[dict]) -> list[dict]:
        todo = [c for c in configs if config_key(c) not in self._pred]
        for c, p in zip(todo, self.model.predict(self.spec, todo, self.hw)):
            self._pred[config_key(c)] = p
        return [self._pred[config_key(c)] for c in configs]

    def candidates(self, config: dict, tried: set[str]) -> list[Candidate]:
        """The legal untried one-knob moves the resource model lets run, in legal_actions' order."""
        moves = [(a, a.apply(config)) for a in legal_actions(self.space, config)]
        moves = [(a, c) for a, c in moves if config_key(c) not in tried]
        preds = self.predict([c for _, c in moves])
        return [Candidate(a, c, config_key(c), p) for (a, c), p in zip(moves, preds)
                if p["estimate"].get("ms") is not None]

    def outcome(self, config: dict, uncertainty_cost: float) -> tuple[str, float | None]:
        """(stage, ms) of running `config`: measured where the dataset has it, else predicted."""
        r = self.measured.get(config_key(config))
        if r is not None and (r["stage"] != "ok" or r.get("ms") is not None):
            return ("compile_error" if r["stage"] in ("masked", "timeout") else r["stage"]), r.get("ms")
        p = self.predict([config])[0]
        if p["p_valid"] < 0.5:
            return "compile_error", None
        return "ok", math.exp(p["log_ms"] + uncertainty_cost * p["std"])


def state_vector(world: SpecWorld, config: dict, ms: float | None, steps: int, max_steps: int,
                 verdict: str, n_moves: int, resources: dict | None = None) -> list[float]:
    """The policy's state: spec, hardware, the best config and its model features, its time
    (measured, or the cost model's) against the cost model's own prediction, the budget, the
    last verdict."""
    pred = world.predict([config])[0]
    ideal = pred["estimate"].get("ideal_ms") or 1e-6
    known = math.log((ms if ms else pred["ms"]) / ideal)
    mv, _ = model_vector(world.spec, config, world.hw, resources)
    return (world.spec_vec + config_vector(config, world.model.layout) + mv
            + [pred["log_ms"] - math.log(ideal), known, pred["std"], steps / max(1, max_steps),
               (max_steps - steps) / max(1, max_steps), n_moves / 32.0]
            + [float(verdict == v) for v in VERDICTS])


def action_size(layout) -> int:
    return len(KINDS) + len(layout.knobs) + 7 + layout.config_size


def action_vector(world: SpecWorld, config: dict, cand: Candidate | None) -> list[float]:
    """One move relative to the best config (None: STOP): its kind and knob, its direction, the
    cost model's predicted gain (log current / new), spread and validity, the roofline's gain,
    and how the config's encoding changes."""
    layout = world.model.layout
    size = action_size(layout)
    if cand is None:
        v = [0.0] * size
        v[KINDS.index("stop")] = 1.0
        v[len(KINDS) + len(layout.knobs)] = 1.0   # the stop flag
        return v
    a = cand.action
    kind = [float(a.kind == k) for k in KINDS]
    knob = [float(a.knob == k) for k in layout.knobs]
    old = config.get(a.knob)
    direction = 0.0
    if isinstance(a.value, (int, float)) and isinstance(old, (int, float)) and not isinstance(a.value, bool):
        direction = 1.0 if a.value > old else -1.0
    cur = world.predict([config])[0]
    gain = max(-GAIN_CLIP, min(GAIN_CLIP, cur["log_ms"] - cand.pred["log_ms"]))
    est_new, est_cur = cand.pred["estimate"].get("ms"), cur["estimate"].get("ms")
    roof_gain = max(-GAIN_CLIP, min(GAIN_CLIP, math.log(est_cur / est_new))) if est_new and est_cur else 0.0
    delta = [n - o for n, o in zip(config_vector(cand.config, layout), config_vector(config, layout))]
    return kind + knob + [0.0, direction, gain, cand.pred["std"], cand.pred["p_valid"], roof_gain,
                          float(gain > 0.01)] + delta


@dataclass
class Episode:
    """The mutable state of one episode."""
    world: SpecWorld
    config: dict
    ms: float | None
    steps: int = 0
    verdict: str = "start"
    tried: set = field(default_factory=set)
    done: bool = False
    moves: list = field(default_factory=list)   # candidates offered now (index i + 1 in the action list)


class PlanEnv:
    """reset(world, start) -> (state, actions); step(i) -> (reward, done); action 0 is STOP."""

    def __init__(self, reward: RewardConfig = RewardConfig()):
        self.reward = reward

    def reset(self, world: SpecWorld, start: dict) -> Episode:
        stage, ms = world.outcome(start, self.reward.uncertainty_cost)
        ep = Episode(world, dict(start), ms if stage == "ok" else None, tried={config_key(start)})
        ep.moves = world.candidates(ep.config, ep.tried)
        return ep

    def observe(self, ep: Episode) -> tuple[list[float], list[list[float]]]:
        s = state_vector(ep.world, ep.config, ep.ms, ep.steps, self.reward.max_steps, ep.verdict, len(ep.moves))
        acts = [action_vector(ep.world, ep.config, None)] + [action_vector(ep.world, ep.config, c) for c in ep.moves]
        return s, acts

    def step(self, ep: Episode, index: int) -> float:
        rc = self.reward
        if index == 0:
            ep.done = True
            return 0.0
        cand = ep.moves[index - 1]
        ep.tried.add(cand.key)
        ep.steps += 1
        stage, ms = ep.world.outcome(cand.config, rc.uncertainty_cost)
        r = -rc.step_cost
        if stage in ("wrong", "ok"):
            r += rc.compile_bonus
        if stage == "ok":
            r += rc.correct_bonus
            base = ep.ms if ep.ms else ep.world.predict([ep.config])[0]["ms"]
            r += max(-1.0, min(3.0, math.log(base / ms)))
            if ms < base:
                ep.config, ep.ms, ep.verdict = dict(cand.config), ms, "faster"
            else:
                ep.verdict = "slower"
        else:
            ep.verdict = stage
        ep.moves = ep.world.candidates(ep.config, ep.tried)
        ep.done = ep.steps >= rc.max_steps or not ep.moves
        return r


def worlds_of(records: list[dict], model: CostModel, which: str | tuple = "train") -> list[SpecWorld]:
    """A world per (spec, GPU) of the records in set(s) `which` whose family the model knows."""
    sets = (which,) if isinstance(which, str) else tuple(which)
    by: dict[tuple, list] = {}
    for r in records:
        if r.get("set") in sets and r["family"] in model.layout.families:
            by.setdefault((r["spec_key"], r["gpu"]), []).append(r)
    out = []
    for rows in by.values():
        spec = KernelSpec.from_dict(rows[0]["spec"])
        out.append(SpecWorld(spec, profile_of(rows[0]), model, {r["config_key"]: r for r in rows}))
    return out


def start_config(world: SpecWorld, rng: random.Random, default_share: float = 0.6) -> dict:
    """The family's default config (the agent's first draft), or sometimes a measured ok config
    of the spec (a warm start from memory)."""
    default = world.family.default_config(world.spec, world.hw)
    oks = [r["config"] for r in world.measured.values() if r["stage"] == "ok"]
    if oks and rng.random() > default_share:
        return dict(rng.choice(oks))
    return default

