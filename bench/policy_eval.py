"""Evaluate the macro policy on the dataset's held-out specs, against the other ways to pick a config.

  python -m bench.policy_eval [--data bench/data/policy] [--checkpoint mtmc/policy/checkpoints/policy.pt]
                              [--out bench/results] [--max-trials 16] [--random-seeds 20] [--allow-unmeasured]

Per held-out (spec, GPU) with at least 3 timed configs, the best measured config is the target;
every method is scored on the configs the dataset measured (nothing else has a real time):
  * first pick (no GPU trial): its regret, measured ms of the pick / best - 1.  The policy and the
    baseline planner walk offline from the family's default config as the agent does without a
    GPU (policy: its own moves and stop in the cost model; baseline: roofline estimates, its 1 %
    rule), moving only to measured configs; the autotuner's first pick is its list's first config;
    random search's is a random measured config (its mean over configs);
  * trials to 95 % of the best (the first trial within best / 0.95): the planners as in the agent's
    loop with a GPU (trial 1 the default config, then one move per trial from the best so far, read
    from the dataset, each planner's own stop rules, at most --max-trials); the autotuner in its
    list's order (the config space's product order, as Triton's autotuner runs its list; it runs
    the whole list before it picks, so its total is the list's length); random search in seeded
    random orders, averaged;
  * the two models as search orders over the measured configs (what a model-guided search tries
    in turn, the autotuner's list sorted by a model): the policy's cost model ("cost_model_rank")
    and the roofline estimate ("roofline_rank"); first pick = the predicted best;
  * legality on a profile never trained on (A100): the policy's offline walk there, every move it
    proposes and every alternative it records checked against the resource model on that profile.
A planner move to a config the dataset did not measure cannot be scored: it is skipped (the next
move in the planner's order is taken) and counted ("unmeasured skips").  Writes
bench/results/<date>-policy-eval.md and .json.
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import itertools
import json
import math
import random
import statistics
import sys
from pathlib import Path

from mtmc.kernels.estimate import estimate_time
from mtmc.policy import baseline, dataset, learned
from mtmc.policy.actions import config_key
from mtmc.policy.cost_model import profile_of
from mtmc.policy.train import usable
from mtmc.tools.hardware import PROFILES

ROOT = Path(__file__).resolve().parents[1]
WITHIN = 0.10      # a first pick "within 10 % of the best"
TARGET = 0.95      # trials to reach 95 % of the best speed
METHODS = ("policy", "baseline", "cost_model_rank", "roofline_rank", "autotuner", "random")


class Spec:
    """One held-out (spec, GPU) of the dataset: measured times, failures, the best."""

    def __init__(self, rows: list[dict]):
        from mtmc.kernels.spec import KernelSpec
        self.spec, self.hw, self.family = KernelSpec.from_dict(rows[0]["spec"]), profile_of(rows[0]), rows[0]["family"]
        self.rows = {r["config_key"]: r for r in rows}
        self.ms = {k: r["ms"] for k, r in self.rows.items() if r["stage"] == "ok" and r.get("ms")}
        self.best = min(self.ms.values()) if self.ms else None
        from mtmc.kernels.catalog import family_of
        self.default = family_of(self.spec).default_config(self.spec, self.hw)
        self.space_size = math.prod(len(v) for v in family_of(self.spec).config_space(self.spec).values())

    def regret(self, key: str) -> float | None:
        ms = self.ms.get(key)
        return None if ms is None else ms / self.best - 1.0

    def hit(self, key: str) -> bool:
        ms = self.ms.get(key)
        return ms is not None and ms <= self.best / TARGET


# -- the planners' walks --------------------------------------------------------------------
def _policy_order(loaded, s: Spec, config: dict, tried: set, steps: int, max_steps: int, measured: bool,
                  current_ms, verdict: str, hw=None) -> tuple[list[tuple[str, dict]], float]:
    """The policy's options from `config`, most probable first: (label or "stop", config)."""
    world, cands, probs, _ = learned.score(loaded, s.spec, config, hw or s.hw, tried=tried, steps_taken=steps,
                                           max_steps=max_steps, current_ms=current_ms if measured else None,
                                           last_verdict=verdict)
    opts = [("stop", config, float(probs[0]))] + [(c.action.label(), c.config, float(probs[i + 1]))
                                                  for i, c in enumerate(cands)]
    opts.sort(key=lambda t: -t[2])
    return [(a, c) for a, c, _ in opts], float(probs[0])


def _baseline_order(s: Spec, config: dict, tried: set, measured: bool, stale: int, steps: int,
                    max_steps: int) -> list[tuple[str, dict]]:
    """The baseline's options from `config`: stop first when its rules stop, then its ranking."""
    d = baseline.decide(s.spec, config, s.hw, tried=tried, measured=measured, steps_taken=steps,
                        max_steps=max_steps, stale_steps=stale)
    _, scored = baseline.rank(s.spec, config, s.hw, tried)
    moves = [(a.label(), a.apply(config)) for a, _ in scored]
    return ([("stop", config)] if d.action["kind"] == "stop" else []) + moves


def walk(s: Spec, order_fn, measured: bool, max_steps: int) -> dict:
    """One planner's walk over the measured configs: trials (keys, in order), kept config, skips."""
    config = dict(s.default)
    key = config_key(config)
    trials, tried, skips, stale, verdict = [key], {key}, 0, 0, "start"
    best_key = key if key in s.ms else None
    best_ms = s.ms.get(key)
    steps = 0
    while steps < max_steps:
        opts = order_fn(config, tried, measured, stale, steps, max_steps, best_ms, verdict)
        pick = None
        for label, cfg in opts:
            if label == "stop":
                break
            k = config_key(cfg)
            if k in tried:
                continue
            if k not in s.rows:       # no real time to score this move: the next one is taken
                skips += 1
                tried.add(k)
                continue
            pick = (cfg, k)
            break
        if pick is None:
            break
        cfg, k = pick
        tried.add(k)
        steps += 1
        if measured:
            trials.append(k)
        ms = s.ms.get(k)
        if ms is not None and (best_ms is None or ms < best_ms):
            config, best_ms, best_key, stale, verdict = dict(cfg), ms, k, 0, "faster"
        else:
            stale += 1
            r = s.rows[k]
            verdict = "slower" if ms is not None else ("wrong" if r["stage"] == "wrong" else "compile_error")
        if not measured:   # offline: the model's choice is followed without a time; the kept config is the last move
            config, best_key = dict(cfg), k
    return {"trials": trials, "kept": best_key if measured else (best_key or key), "skips": skips,
            "steps": steps}


def first_hit(s: Spec, keys: list[str]) -> int | None:
    return next((i + 1 for i, k in enumerate(keys) if s.hit(k)), None)


def product_order(s: Spec) -> list[str]:
    """The autotuner's list: the config space's product, in order, as far as the dataset measured it."""
    from mtmc.kernels.catalog import family_of
    space = family_of(s.spec).config_space(s.spec)
    base = dict(s.default)
    order = []
    for combo in itertools.product(*space.values()):
        k = config_key({**base, **dict(zip(space, combo))})
        if k in s.rows:
            order.append(k)
    seen = set(order)
    return order + [k for k in s.rows if k not in seen]   # measured configs off the product (none usually)


def model_order(s: Spec, loaded) -> list[str]:
    """The measured configs by the policy's cost model: predicted valid ones by predicted time,
    then the rest (what a model-guided search would try in turn)."""
    keys = list(s.rows)
    preds = loaded.cost.predict(s.spec, [s.rows[k]["config"] for k in keys], s.hw)
    score = [p["log_ms"] if p["p_valid"] >= 0.5 and p["estimate"].get("ms") is not None else math.inf
             for p in preds]
    return [k for _, _, k in sorted(zip(score, range(len(keys)), keys))]


def roofline_order(s: Spec) -> list[str]:
    """The measured configs by the roofline estimate (the baseline's model); ruled-out ones last."""
    keys = list(s.rows)
    est = [estimate_time(s.spec, s.rows[k]["config"], s.hw).get("ms") for k in keys]
    return [k for _, _, k in sorted(zip([e if e is not None else math.inf for e in est], range(len(keys)), keys))]


def evaluate_spec(s: Spec, loaded, max_trials: int, seeds: int) -> dict:
    autotune = product_order(s)
    out = {"family": s.family, "spec_key": s.spec.key(), "gpu": s.hw.name, "configs": len(s.rows),
           "timed": len(s.ms), "best_ms": s.best, "exhaustive": s.space_size == len(autotune)}

    def pol(config, tried, measured, stale, steps, max_steps, best_ms, verdict):
        if measured and stale >= 3:   # the loop's patience rule, as learned.decide applies it
            return [("stop", config)]
        return _policy_order(loaded, s, config, tried, steps, max_steps, measured, best_ms, verdict)[0]

    def base(config, tried, measured, stale, steps, max_steps, best_ms, verdict):
        return _baseline_order(s, config, tried, measured, stale, steps, max_steps)

    for name, fn in (("policy", pol), ("baseline", base)):
        offline = walk(s, fn, measured=False, max_steps=8)
        online = walk(s, fn, measured=True, max_steps=max_trials - 1)
        out[name] = {"first_pick_regret": s.regret(offline["kept"]), "first_pick": offline["kept"],
                     "offline_steps": offline["steps"], "trials_to_95": first_hit(s, online["trials"]),
                     "trials": len(online["trials"]), "final_regret": s.regret(online["kept"]) if online["kept"] else None,
                     "unmeasured_skips": offline["skips"] + online["skips"]}
    for name, order in (("cost_model_rank", model_order(s, loaded)), ("roofline_rank", roofline_order(s))):
        out[name] = {"first_pick_regret": s.regret(order[0]), "trials_to_95": first_hit(s, order),
                     "trials": len(order)}
    out["autotuner"] = {"first_pick_regret": next((s.regret(k) for k in autotune if k in s.ms), None),
                        "trials_to_95": first_hit(s, autotune), "trials": len(autotune), "final_regret": 0.0}
    keys = list(s.rows)
    hits = []
    for seed in range(seeds):
        perm = keys[:]
        random.Random(f"{seed}:{s.spec.key()}").shuffle(perm)
        hits.append(first_hit(s, perm) or len(perm) + 1)
    ok_regrets = [s.regret(k) for k in s.ms]
    # a random first pick: the mean regret over the timed configs (a failed one is counted apart)
    out["random"] = {"first_pick_regret": statistics.mean(ok_regrets),
                     "trials_to_95": statistics.mean(hits), "trials": len(keys),
                     "first_pick_failed_share": 1 - len(s.ms) / len(keys)}
    return out


def legality(loaded, s: Spec, hw) -> dict:
    """The policy's offline walk on `hw`: every move proposed and every alternative recorded,
    checked against the resource model on `hw` (a proposal it rules out is a violation)."""
    config, tried, checked, bad = dict(s.default), {config_key(s.default)}, 0, []
    for step in range(8):
        d = learned.decide(s.spec, config, hw, tried=tried, measured=False, steps_taken=step, max_steps=8,
                           stale_steps=0, checkpoint=loaded.path)
        labels = [a["action"] for a in d.alternatives]
        if d.action["kind"] != "stop":
            labels.append(f"{d.action['knob']}={d.action['value']}")
        for label in labels:
            if label == "stop":
                continue
            checked += 1
            if estimate_time(s.spec, _apply_label(config, label, s), hw).get("ms") is None:
                bad.append(label)
        if d.action["kind"] == "stop":
            break
        config = {**config, d.action["knob"]: d.action["value"]}
        tried.add(config_key(config))
    return {"checked": checked, "violations": bad}


def _apply_label(config: dict, label: str, s: Spec) -> dict:
    """The config an alternative's label ("BLOCK_M=64") leads to, its value read back from the space."""
    from mtmc.kernels.catalog import family_of
    knob, _, text = label.partition("=")
    values = family_of(s.spec).config_space(s.spec).get(knob, [])
    value = next((v for v in values if str(v) == text), text)
    return {**config, knob: value}


# -- report ---------------------------------------------------------------------------------
def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def aggregate(rows: list[dict]) -> dict:
    out = {}
    groups = collections.defaultdict(list)
    for r in rows:
        groups[r["family"]].append(r)
        groups["all"].append(r)
        if r["exhaustive"]:   # every config of the space measured: the planners' walks are fully scorable
            groups["all, whole space measured"].append(r)
    for fam, rs in sorted(groups.items(), key=lambda kv: (not kv[0].startswith("all"), kv[0])):
        g = {"specs": len(rs), "configs_median": _median([r["configs"] for r in rs])}
        for m in METHODS:
            regrets = [r[m]["first_pick_regret"] for r in rs]
            known = [x for x in regrets if x is not None]
            hits = [r[m]["trials_to_95"] for r in rs]
            g[m] = {"first_pick_within_10pct": (sum(1 for x in known if x <= WITHIN) / len(rs)) if rs else None,
                    "first_pick_regret_median": _median(regrets),
                    "trials_to_95_median": _median([h if h is not None else math.inf for h in hits]),
                    "reached_95": sum(1 for h in hits if h is not None) / len(rs),
                    "trials_median": _median([r[m]["trials"] for r in rs])}
            if m in ("policy", "baseline"):
                g[m]["unmeasured_skips"] = sum(r[m]["unmeasured_skips"] for r in rs)
        out[fam] = g
    return out


def _fmt(x, pct=False):
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "not reached"
    return f"{x:.0%}" if pct else (f"{x:.3g}" if isinstance(x, float) else str(x))


def markdown(meta: dict, agg: dict, legal: dict) -> str:
    lines = [f"# Macro policy evaluation ({meta['date'][:10]})", "",
             f"Checkpoint: `{meta['checkpoint']}` ({meta['policy']}).",
             f"Data: {meta['data']['records']} records ({meta['data']['measured']} with a GPU time) from "
             f"{', '.join(meta['data']['devices'])}; held-out specs scored: {agg.get('all', {}).get('specs', 0)}.",
             "Scored only on configs the dataset measured; see bench/policy_eval.py for the definitions."]
    if meta.get("in_sample"):
        lines += ["", "**In-sample:** this checkpoint was trained on the held-out split too (the data held too "
                  "few specs to hold any out), so the policy's and the cost model's numbers below are on specs "
                  "they were trained on, not a generalization result. The cost model's leave-one-spec-out "
                  f"score: {meta['in_sample']}."]
    lines += ["",
             "## First pick (no GPU trial): share within 10 % of the best measured, median regret", "",
             "| family | specs | " + " | ".join(METHODS) + " |", "|---|---|" + "---|" * len(METHODS)]
    for fam, g in agg.items():
        lines.append(f"| {fam} | {g['specs']} | " + " | ".join(
            f"{_fmt(g[m]['first_pick_within_10pct'], True)}, {_fmt(g[m]['first_pick_regret_median'], True)}"
            for m in METHODS) + " |")
    lines += ["", "## GPU trials to reach 95 % of the best (median; share of specs that reach it)", "",
              "| family | " + " | ".join(METHODS) + " | autotuner's full list |", "|---|" + "---|" * (len(METHODS) + 1)]
    for fam, g in agg.items():
        lines.append(f"| {fam} | " + " | ".join(
            f"{_fmt(g[m]['trials_to_95_median'])} ({_fmt(g[m]['reached_95'], True)})" for m in METHODS)
            + f" | {_fmt(g['autotuner']['trials_median'])} |")
    skips = agg.get("all", {})
    lines += ["", f"Planner moves to configs the dataset did not measure (skipped, the next move taken): policy "
              f"{skips.get('policy', {}).get('unmeasured_skips', 0)}, baseline {skips.get('baseline', {}).get('unmeasured_skips', 0)}.",
              "", f"## Legality on {legal['profile']} (a profile not trained on)", "",
              f"{legal['checked']} proposals (moves and recorded alternatives) over {legal['specs']} specs checked "
              f"against the resource model on {legal['profile']}: {len(legal['violations'])} violations."]
    if legal["violations"]:
        lines += [f"- {v}" for v in legal["violations"][:20]]
    return "\n".join(lines) + "\n"


def _in_sample(meta: dict) -> str | None:
    """None when the checkpoint held the held-out split out; else its leave-one-spec-out score."""
    if "heldout" not in meta.get("trained_on_sets", ["train"]):
        return None
    loo = (meta.get("cost_model") or {}).get("eval", {}).get("leave_one_spec_out") or {}
    if not loo.get("specs"):
        return "none (too few specs)"
    return (f"mean Spearman {loo['spearman']:.2f}, median top-1 regret {loo['top1_regret_median']:.0%} "
            f"over {loo['specs']} specs")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.policy_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", default=[str(dataset.DEFAULT_DIR)])
    p.add_argument("--checkpoint", default=None, help="default: mtmc.policy.learned.checkpoint_path()")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--name", default=None, help="file stem (default <date>-policy-eval)")
    p.add_argument("--max-trials", type=int, default=16)
    p.add_argument("--random-seeds", type=int, default=20)
    p.add_argument("--legality-profile", default="a100")
    p.add_argument("--allow-unmeasured", action="store_true", help="score rows without a GPU time (tests)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    import torch
    torch.set_num_threads(1)
    args = parse_args(argv)
    loaded = learned.load_policy(args.checkpoint)
    if loaded is None:
        print(f"no checkpoint at {args.checkpoint or learned.checkpoint_path()}; train one with "
              "python -m mtmc.policy.train", file=sys.stderr)
        return 2
    paths = dataset.paths_of(args.data)
    records = usable([r for p in paths for r in dataset.load(p)], args.allow_unmeasured)
    groups = collections.defaultdict(list)
    for r in records:
        if r["set"] == "heldout" and r["family"] in loaded.meta.get("families", []):
            groups[(r["spec_key"], r["gpu"])].append(r)
    specs = [s for s in map(Spec, groups.values()) if len(s.ms) >= 3]
    rows = []
    for i, s in enumerate(specs):
        rows.append(evaluate_spec(s, loaded, args.max_trials, args.random_seeds))
        print(f"[{i + 1}/{len(specs)}] {s.family}: policy first pick regret "
              f"{_fmt(rows[-1]['policy']['first_pick_regret'], True)}, trials to 95 % "
              f"{_fmt(rows[-1]['policy']['trials_to_95'])}", flush=True)
    hw = PROFILES[args.legality_profile]
    legal = {"profile": hw.name, "checked": 0, "violations": [], "specs": len(specs)}
    for s in specs:
        r = legality(loaded, s, hw)
        legal["checked"] += r["checked"]
        legal["violations"] += [f"{s.family} {s.spec.key()}: {v}" for v in r["violations"]]
    agg = aggregate(rows)
    from bench.record import run_meta
    from mtmc.policy.train import data_summary
    meta = run_meta(checkpoint=str(Path(loaded.path).resolve().relative_to(ROOT)) if Path(loaded.path).resolve()
                    .is_relative_to(ROOT) else loaded.path, policy=loaded.name,
                    data=data_summary(paths, {str(p): dataset.load(p) for p in paths}),
                    max_trials=args.max_trials, random_seeds=args.random_seeds,
                    in_sample=_in_sample(loaded.meta))
    stem = args.name or f"{dt.datetime.now(dt.timezone.utc).date().isoformat()}-policy-eval"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "summary": agg, "legality": legal, "specs": rows},
                                                 indent=1, default=str))
    (out / f"{stem}.md").write_text(markdown(meta, agg, legal))
    print(markdown(meta, agg, legal))
    print(f"wrote {out / stem}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
