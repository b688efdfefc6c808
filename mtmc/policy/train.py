"""Train the macro policy: the cost model on the dataset, then PPO in the model-based environment.

  python -m mtmc.policy.train [--data bench/data/policy] [--out mtmc/policy/checkpoints/policy.pt]
                              [--seed 0] [--cost-epochs 60] [--iterations 60] [--allow-unmeasured]

1. Load the dataset (policy.dataset); its train split fits the cost model (policy.cost_model),
   its held-out split scores it (per-spec rank correlation, top-1 regret).
2. One world per training spec (policy.env); PPO (clipped surrogate, GAE, entropy bonus) trains
   the actor-critic (policy.network) on episodes run in lockstep, a batch of them per iteration.
3. Save one checkpoint: the cost model's and the policy's state dicts, the feature layout, and a
   JSON-able meta: the data files and their record counts, GPUs, versions, date, the training
   configs, the evaluation numbers and the training time.
Seeded (Python's and torch's RNGs, one CPU thread): the same data and seed give the same weights.
--with-heldout trains on the held-out split too (when the data is too small to hold any out: the
meta says so, the cost model's score is then leave-one-spec-out, and bench.policy_eval's numbers
are in-sample).  Records without a real GPU time (the interpreter's, or a test fixture) are refused unless
--allow-unmeasured, so a checkpoint never silently rests on made-up times; the meta says which.
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import math
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mtmc.kernels.spec import KernelSpec
from mtmc.policy import dataset
from mtmc.policy.cost_model import CostConfig, CostModel, leave_one_out, rank_metrics, train_cost_model
from mtmc.policy.env import PlanEnv, RewardConfig, SpecWorld, action_size, start_config, worlds_of
from mtmc.policy.features import Layout
from mtmc.policy.network import ActorCritic, pad

DEFAULT_OUT = Path(__file__).resolve().parent / "checkpoints" / "policy.pt"
FORMAT = 1


@dataclass
class PPOConfig:
    iterations: int = 60
    episodes: int = 64          # per iteration, run in lockstep
    epochs: int = 4
    minibatch: int = 256
    lr: float = 3e-4
    clip: float = 0.2
    gamma: float = 1.0          # short episodes: no discount, the step cost does that job
    lam: float = 0.95
    entropy: float = 0.01
    value_coef: float = 0.5
    hidden: int = 128
    seed: int = 0


# -- PPO --------------------------------------------------------------------------------------
def rollouts(net: ActorCritic, env: PlanEnv, worlds: list[SpecWorld], n: int, rng: random.Random,
             greedy: bool = False, random_actions: bool = False, starts: list[dict] | None = None) -> list[list[dict]]:
    """n episodes run in lockstep (one batched forward per step); per episode its transitions
    {s, a, n_actions, idx, logp, v, r}, and "final" (ms) / "start_ms" on the last one."""
    by_family: dict[str, list[SpecWorld]] = collections.defaultdict(list)
    for w in worlds:
        by_family[w.spec.family].append(w)
    fams = sorted(by_family)
    eps, trajs = [], []
    for i in range(n):
        if starts is None:   # every family as often, whatever its count of specs
            w = rng.choice(by_family[rng.choice(fams)])
            eps.append(env.reset(w, start_config(w, rng)))
        else:
            eps.append(env.reset(worlds[i], starts[i]))
        trajs.append([])
    start_ms = [e.ms for e in eps]
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    while True:
        live = [i for i, e in enumerate(eps) if not e.done]
        if not live:
            break
        obs = [env.observe(eps[i]) for i in live]
        a, mask = pad([o[1] for o in obs], net.action_dim)
        s = torch.tensor([o[0] for o in obs], dtype=torch.float32)
        with torch.no_grad():
            logits, v = net(s, a, mask)
        if random_actions:
            logits = torch.zeros_like(logits).masked_fill(~mask, float("-inf"))
        logp_all = torch.log_softmax(logits, -1)
        idx = logits.argmax(-1) if greedy else torch.multinomial(logp_all.exp(), 1, generator=gen).squeeze(-1)
        for j, i in enumerate(live):
            k = int(idx[j])
            r = env.step(eps[i], k)
            trajs[i].append({"s": obs[j][0], "a": obs[j][1], "idx": k, "logp": float(logp_all[j, k]),
                             "v": float(v[j]), "r": r})
    for i, e in enumerate(eps):
        trajs[i][-1].update(final_ms=e.ms, start_ms=start_ms[i], steps=e.steps, family=e.world.spec.family)
    return trajs


def advantages(traj: list[dict], gamma: float, lam: float) -> None:
    """GAE in place: "adv" and "ret" per transition (the episode ends after its last one)."""
    gae, next_v = 0.0, 0.0
    for t in reversed(traj):
        delta = t["r"] + gamma * next_v - t["v"]
        gae = delta + gamma * lam * gae
        t["adv"], t["ret"] = gae, gae + t["v"]
        next_v = t["v"]


def ppo_update(net: ActorCritic, opt, batch: list[dict], cfg: PPOConfig, rng: random.Random) -> dict:
    adv = torch.tensor([t["adv"] for t in batch])
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    stats = collections.defaultdict(float)
    n_mb = 0
    for _ in range(cfg.epochs):
        order = list(range(len(batch)))
        rng.shuffle(order)
        for b in range(0, len(order), cfg.minibatch):
            mb = order[b:b + cfg.minibatch]
            s = torch.tensor([batch[i]["s"] for i in mb], dtype=torch.float32)
            a, mask = pad([batch[i]["a"] for i in mb], net.action_dim)
            idx = torch.tensor([batch[i]["idx"] for i in mb])
            old = torch.tensor([batch[i]["logp"] for i in mb])
            ret = torch.tensor([batch[i]["ret"] for i in mb], dtype=torch.float32)
            logits, v = net(s, a, mask)
            logp_all = torch.log_softmax(logits, -1)
            logp = logp_all.gather(1, idx[:, None]).squeeze(1)
            ratio = (logp - old).exp()
            A = adv[mb]
            pg = -torch.min(ratio * A, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * A).mean()
            p = logp_all.exp()
            ent = -(p * logp_all.masked_fill(~mask, 0.0)).sum(-1).mean()
            vloss = (v - ret).pow(2).mean()
            loss = pg + cfg.value_coef * vloss - cfg.entropy * ent
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            stats["policy_loss"] += float(pg.detach())
            stats["value_loss"] += float(vloss.detach())
            stats["entropy"] += float(ent.detach())
            n_mb += 1
    return {k: v / max(1, n_mb) for k, v in stats.items()}


def summarize(trajs: list[list[dict]]) -> dict:
    """Mean return, steps and log speedup (start -> kept draft) of episodes."""
    rets = [sum(t["r"] for t in tr) for tr in trajs]
    last = [tr[-1] for tr in trajs]
    sp = [math.log(t["start_ms"] / t["final_ms"]) for t in last if t.get("start_ms") and t.get("final_ms")]
    return {"episodes": len(trajs), "return": sum(rets) / len(rets), "steps": sum(t["steps"] for t in last) / len(last),
            "log_speedup": sum(sp) / len(sp) if sp else 0.0}


def train_policy(worlds: list[SpecWorld], layout: Layout, reward: RewardConfig, cfg: PPOConfig,
                 log=print) -> tuple[ActorCritic, list[dict]]:
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    env = PlanEnv(reward)
    probe = env.reset(worlds[0], start_config(worlds[0], rng))
    s0, _ = env.observe(probe)
    net = ActorCritic(len(s0), action_size(layout), cfg.hidden)
    # fixed input statistics from random-action episodes, before any update
    warm = rollouts(net, env, worlds, max(32, cfg.episodes), rng, random_actions=True)
    net.set_normalization(torch.tensor([t["s"] for tr in warm for t in tr], dtype=torch.float32))
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    history = []
    for it in range(cfg.iterations):
        trajs = rollouts(net, env, worlds, cfg.episodes, rng)
        for tr in trajs:
            advantages(tr, cfg.gamma, cfg.lam)
        stats = ppo_update(net, opt, [t for tr in trajs for t in tr], cfg, rng)
        row = {"iteration": it + 1, **summarize(trajs), **stats}
        history.append(row)
        if log and (it % 10 == 0 or it == cfg.iterations - 1):
            log(f"  ppo {it + 1}/{cfg.iterations}: return {row['return']:+.3f}, steps {row['steps']:.2f}, "
                f"log speedup {row['log_speedup']:+.3f}, entropy {row['entropy']:.3f}")
    net.eval()
    return net, history


def greedy_eval(net: ActorCritic, worlds: list[SpecWorld], reward: RewardConfig) -> dict:
    """The policy's greedy episodes from each world's default config, in the model."""
    if not worlds:
        return {"episodes": 0}
    starts = [w.family.default_config(w.spec, w.hw) for w in worlds]
    trajs = rollouts(net, PlanEnv(reward), worlds, len(worlds), random.Random(0), greedy=True, starts=starts)
    out = summarize(trajs)
    by = collections.defaultdict(list)
    for tr in trajs:
        by[tr[-1]["family"]].append(tr)
    out["per_family"] = {f: {k: round(v, 4) for k, v in summarize(t).items()} for f, t in sorted(by.items())}
    return out


# -- the checkpoint ---------------------------------------------------------------------------
def save(path: Path, cost: CostModel, net: ActorCritic, reward: RewardConfig, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": FORMAT, "cost_model": cost.state(),
                "policy": {"config": net.config(), "state_dict": net.state_dict()},
                "reward": reward.to_dict(), "meta": meta}, path)


def load(path) -> tuple[CostModel, ActorCritic, RewardConfig, dict]:
    ck = torch.load(path, map_location="cpu", weights_only=True)
    if ck.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {ck.get('format')}, this code reads {FORMAT}")
    net = ActorCritic(**ck["policy"]["config"])
    net.load_state_dict(ck["policy"]["state_dict"])
    net.eval()
    return CostModel.from_state(ck["cost_model"]), net, RewardConfig(**ck["reward"]), ck["meta"]


def data_summary(paths: list[Path], records_by_file: dict[str, list[dict]]) -> dict:
    files = {}
    for p in paths:
        rs = records_by_file[str(p)]
        files[p.name] = {"records": len(rs), "measured": sum(1 for r in rs if r.get("measured")),
                         "stages": dict(collections.Counter(r["stage"] for r in rs)),
                         "gpus": sorted({r["gpu"] for r in rs}), "devices": sorted({r["device_name"] for r in rs})}
    allr = [r for rs in records_by_file.values() for r in rs]
    return {"files": files, "records": len(allr), "measured": sum(1 for r in allr if r.get("measured")),
            "specs": len({(r["spec_key"], r["gpu"]) for r in allr}),
            "gpus": sorted({r["gpu"] for r in allr}), "devices": sorted({r["device_name"] for r in allr}),
            "data_versions": sorted({f"torch {(r.get('versions') or {}).get('torch')}, triton "
                                     f"{(r.get('versions') or {}).get('triton')}" for r in allr})}


def usable(records: list[dict], allow_unmeasured: bool) -> list[dict]:
    """The rows a checkpoint may rest on: real GPU times (and every failed or masked row of a
    GPU run); with allow_unmeasured, the untimed and fixture rows too."""
    if allow_unmeasured:
        return records
    gpu_runs = {r["run"] for r in records if r.get("measured")}
    return [r for r in records if r["run"] in gpu_runs and (r["stage"] != "ok" or r.get("measured"))]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m mtmc.policy.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", default=[str(dataset.DEFAULT_DIR)], help="dataset files or folders")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cost-epochs", type=int, default=CostConfig.epochs)
    p.add_argument("--members", type=int, default=CostConfig.members)
    p.add_argument("--iterations", type=int, default=PPOConfig.iterations)
    p.add_argument("--episodes", type=int, default=PPOConfig.episodes)
    p.add_argument("--with-heldout", action="store_true",
                   help="also train on the held-out split (too little data for a split); the meta says so, "
                        "and the cost model is scored leave-one-spec-out instead")
    p.add_argument("--allow-unmeasured", action="store_true",
                   help="train on rows without a GPU time (tests, fixtures); the meta says so")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)   # small matrices: one thread is faster, and the result reproducible
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    t0 = time.monotonic()
    paths = dataset.paths_of(args.data)
    by_file = {str(p): dataset.load(p) for p in paths}
    records = usable([r for rs in by_file.values() for r in rs], args.allow_unmeasured)
    if not records:
        print(f"no usable records in {', '.join(args.data)} (measured GPU rows; --allow-unmeasured "
              "for others)", file=sys.stderr)
        return 2
    sets = ("train", "heldout") if args.with_heldout else ("train",)
    train = [r for r in records if r["set"] in sets]
    held = [r for r in records if r["set"] == "heldout"]
    specs = {r["spec_key"]: KernelSpec.from_dict(r["spec"]) for r in records}
    layout = Layout.build(list(specs.values()), [r["config"] for r in records])
    print(f"{len(records)} records ({len(train)} train, {len(held)} held out) over {len(specs)} specs "
          f"from {len(paths)} files")
    cost_cfg = CostConfig(epochs=args.cost_epochs, members=args.members, seed=args.seed)
    cost, cost_info = train_cost_model(train, layout, cost_cfg, log=print)
    cost_eval = {"heldout": rank_metrics(cost, held), "train": rank_metrics(cost, train)}
    if args.with_heldout:   # the held-out rows were trained on: only a leave-one-spec-out fit scores them
        cost_eval["heldout_in_sample"] = cost_eval.pop("heldout")
        cost_eval["leave_one_spec_out"] = leave_one_out(records, layout, cost_cfg)
        cost_eval["heldout"] = {k: v for k, v in cost_eval["leave_one_spec_out"].items() if k != "per_spec"}
    print(f"cost model: held-out Spearman {cost_eval['heldout'].get('spearman', float('nan')):.3f} over "
          f"{cost_eval['heldout'].get('specs', 0)} specs ({time.monotonic() - t0:.0f} s)")
    reward = RewardConfig()
    ppo_cfg = PPOConfig(iterations=args.iterations, episodes=args.episodes, seed=args.seed)
    worlds = worlds_of(records, cost, sets)
    net, history = train_policy(worlds, layout, reward, ppo_cfg)
    policy_eval = {"train": greedy_eval(net, worlds, reward),
                   "heldout": greedy_eval(net, worlds_of(records, cost, "heldout"), reward)}
    train_s = time.monotonic() - t0
    from importlib.metadata import version
    meta = {"trained": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "data": data_summary(paths, by_file), "used_records": len(records),
            "measured_only": not args.allow_unmeasured, "trained_on_sets": list(sets),
            "versions": {"torch": str(torch.__version__), "triton": version("triton"), "python": platform.python_version()},
            "config": {"cost": cost_cfg.to_dict(), "ppo": asdict(ppo_cfg), "reward": reward.to_dict(), "seed": args.seed},
            "families": sorted({r["family"] for r in train}),
            "cost_model": {"rows": cost_info["rows"], "specs": cost_info["specs"],
                           "final_loss": [ls[-1] for ls in cost_info["losses"]], "eval": cost_eval},
            "ppo": {"history": history[-1:], "eval": policy_eval}, "train_s": round(train_s, 1)}
    out = Path(args.out)
    save(out, cost, net, reward, meta)
    print(f"saved {out} ({out.stat().st_size / 1e6:.2f} MB) after {train_s:.0f} s; greedy held-out episodes in the "
          f"model: log speedup {policy_eval['heldout'].get('log_speedup', 0):+.3f}, "
          f"{policy_eval['heldout'].get('steps', 0):.2f} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
