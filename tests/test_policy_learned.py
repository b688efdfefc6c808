"""The learned macro policy on a small fixture dataset (tests/policy_fixture.py: roofline times plus
noise, never real measurements): the cost model's training, the environment's masks and rewards,
the checkpoint, the planner's use of it, and its evaluation command."""
from __future__ import annotations

import json
import math
import time
from types import SimpleNamespace

import pytest
import torch

from kernel_helpers import compile_configs
from mtmc.agents import planner
from mtmc.agents.context import Context
from mtmc.kernels.catalog import family_of
from mtmc.kernels.estimate import estimate_time
from mtmc.kernels.spec import KernelSpec
from mtmc.policy import baseline, dataset, learned, train
from mtmc.policy.actions import config_key, legal_actions
from mtmc.policy.cost_model import CostConfig, rank_metrics, train_cost_model
from mtmc.policy.env import PlanEnv, RewardConfig, SpecWorld, worlds_of
from mtmc.policy.features import Layout, feature_size, features
from mtmc.tools.hardware import PROFILES
from policy_fixture import FIXTURE_DEVICE, write_fixture

H200, A100 = PROFILES["h200"], PROFILES["a100"]
FAMILIES = ["elementwise", "softmax", "matmul"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("policy-data")
    records = write_fixture(folder, FAMILIES, specs_per_family=5, configs_per_spec=16, exhaustive_heldout=40)
    return folder, records


@pytest.fixture(scope="module")
def checkpoint(data, tmp_path_factory):
    folder, _ = data
    out = tmp_path_factory.mktemp("policy-ck") / "policy.pt"
    assert train.main(["--data", str(folder), "--out", str(out), "--cost-epochs", "8", "--members", "2",
                       "--iterations", "3", "--episodes", "16"]) == 2, "fixture rows must be refused by default"
    assert train.main(["--data", str(folder), "--out", str(out), "--cost-epochs", "8", "--members", "2",
                       "--iterations", "3", "--episodes", "16", "--allow-unmeasured"]) == 0
    return out


def _layout(records):
    specs = [KernelSpec.from_dict(r["spec"]) for r in records]
    return Layout.build(specs, [r["config"] for r in records])


def _spec(records, family, which="heldout"):
    r = next(r for r in records if r["family"] == family and r["set"] == which)
    return KernelSpec.from_dict(r["spec"])


def test_features_are_fixed_length_across_families(data):
    _, records = data
    layout = _layout(records)
    sizes = {len(features(KernelSpec.from_dict(r["spec"]), r["config"], H200, layout, r["resources"])[0])
             for r in records[::7]}
    assert sizes == {feature_size(layout)}
    assert Layout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout


def test_training_lowers_the_loss_and_ranks_held_out_specs(data):
    _, records = data
    train_rows = [r for r in records if r["set"] == "train"]
    model, info = train_cost_model(train_rows, _layout(records), CostConfig(epochs=12, members=1))
    losses = info["losses"][0]
    assert losses[-1] < 0.5 * losses[0], losses
    held = rank_metrics(model, [r for r in records if r["set"] == "heldout"])
    assert held["specs"] >= 3 and held["spearman"] > 0.3, held


def test_masks_never_offer_a_config_the_resource_model_rules_out(checkpoint, data):
    _, records = data
    loaded = learned.load_policy(checkpoint)
    spec = _spec(records, "matmul")
    space = family_of(spec).config_space(spec)
    # a corner of the space where many neighbours overflow shared memory
    config = {**family_of(spec).default_config(spec, H200), "BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128,
              "num_stages": 4}
    for hw in (H200, A100):
        world = SpecWorld(spec, hw, loaded.cost)
        offered = {c.key for c in world.candidates(config, set())}
        for a in legal_actions(space, config):
            new = a.apply(config)
            legal = estimate_time(spec, new, hw).get("ms") is not None
            assert (config_key(new) in offered) == legal, (hw.name, a.label())
        assert len(offered) < len(legal_actions(space, config))   # some were masked
        d = learned.decide(spec, config, hw, tried=set(), measured=False, steps_taken=0, max_steps=8,
                           stale_steps=0, checkpoint=checkpoint)
        for alt in d.alternatives:
            assert alt["action"] == "stop" or alt["action"] in {a.label() for a in legal_actions(space, config)
                                                                if config_key(a.apply(config)) in offered}


def test_the_policys_picks_compile_for_sm90_within_the_h200_limits(checkpoint, data):
    _, records = data
    items = {}
    for family in FAMILIES:
        spec = _spec(records, family)
        config, tried = family_of(spec).default_config(spec, H200), set()
        for step in range(3):   # a short offline walk; every move is compiled
            d = learned.decide(spec, config, H200, tried=tried, measured=False, steps_taken=step, max_steps=8,
                               stale_steps=0, checkpoint=checkpoint)
            move = d.action if d.action["kind"] != "stop" else next(
                ({"knob": a["action"].split("=")[0], "label": a["action"]} for a in d.alternatives
                 if a["action"] != "stop"), None)
            if move is None:
                break
            if "label" in move:   # the policy stopped: compile its likeliest move anyway
                knob, text = move["label"].split("=")
                value = next(v for v in family_of(spec).config_space(spec)[knob] if str(v) == text)
                config = {**config, knob: value}
            else:
                config = {**config, move["knob"]: move["value"]}
            tried.add(config_key(config))
            items[f"{family}-{step}"] = (spec.to_dict(), dict(config))
    reports = compile_configs(items)
    for name, rep in reports.items():
        assert rep["kernels"] and not any(k.get("error") for k in rep["kernels"]), name
        blocking = [v for v in rep["violations"] if v["kind"] in ("smem_overflow", "too_many_regs")]
        assert not blocking, (name, blocking)
        for k in rep["kernels"]:
            assert k["shared_bytes"] <= H200.smem_per_block and k["regs"] <= H200.max_regs_per_thread


def test_rewards_follow_the_design(data):
    _, records = data
    layout = _layout(records)
    model, _ = train_cost_model([r for r in records if r["set"] == "train"], layout, CostConfig(epochs=2, members=1))
    world = next(w for w in worlds_of(records, model, "train") if w.spec.family == "elementwise")
    rc = RewardConfig()
    env = PlanEnv(rc)
    start = family_of(world.spec).default_config(world.spec, world.hw)
    ep = env.reset(world, start)
    assert ep.moves and all(c.pred["estimate"]["ms"] is not None for c in ep.moves)
    measured = [i for i, c in enumerate(ep.moves) if c.key in world.measured and world.measured[c.key]["stage"] == "ok"]
    i = measured[0]
    cand, before = ep.moves[i], ep.ms
    after = world.measured[cand.key]["ms"]
    r = env.step(ep, i + 1)
    expected = rc.compile_bonus + rc.correct_bonus - rc.step_cost + max(-1.0, min(3.0, math.log(before / after)))
    assert r == pytest.approx(expected)
    assert ep.ms == min(before, after) and ep.steps == 1 and cand.key in ep.tried
    assert env.step(ep, 0) == 0.0 and ep.done   # stop


def test_checkpoint_loads_and_plans_within_50_ms(checkpoint, data):
    _, records = data
    learned._CACHE.clear()
    t0 = time.perf_counter()
    loaded = learned.load_policy(checkpoint)
    load_s = time.perf_counter() - t0
    assert load_s < 2.0, load_s
    assert loaded.meta["measured_only"] is False and FIXTURE_DEVICE in loaded.meta["data"]["devices"]
    assert "NOT all measured" in loaded.name
    assert checkpoint.stat().st_size < 8e6
    spec = _spec(records, "matmul")
    config = family_of(spec).default_config(spec, H200)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        d = learned.decide(spec, config, H200, tried=set(), measured=False, steps_taken=0, max_steps=8,
                           stale_steps=0, checkpoint=checkpoint)
        times.append(time.perf_counter() - t0)
    assert min(times) < 0.05, times    # the best of five: the machine is shared
    assert d.policy == loaded.name and d.alternatives
    assert all(a["source"] == learned.PREDICTION for a in d.alternatives)
    assert abs(sum(a["prob"] for a in d.alternatives)) <= 1.0001


def test_fallback_to_the_baseline_says_so(tmp_path, checkpoint, data):
    _, records = data
    spec = _spec(records, "softmax")
    config = family_of(spec).default_config(spec, H200)
    kw = dict(tried=set(), measured=False, steps_taken=0, max_steps=8, stale_steps=0)
    d = learned.decide(spec, config, H200, checkpoint=tmp_path / "none.pt", **kw)
    assert d.policy == baseline.POLICY_NAME and d.reason.startswith("baseline planner (no policy checkpoint")
    other = KernelSpec("reduction", "sum", {"M": 512, "N": 1000}, "float32")   # not in the fixture's families
    d = learned.decide(other, family_of(other).default_config(other, H200), H200, checkpoint=checkpoint, **kw)
    assert d.policy == baseline.POLICY_NAME and "not trained on the reduction family" in d.reason


def _plan_state(spec, config):
    best = {"config": config, "step": 0, "time_ms": 0.5,
            "verdict": {"ok": True, "measured": False, "resources": {"kernels": []}}}
    return {"spec": spec.to_dict(), "best": best, "steps": [{"step": 0, "origin": "template", "verdict": best["verdict"]}],
            "tried": [config_key(config)], "stale_steps": 0}


def test_the_planner_records_the_policys_probabilities(monkeypatch, checkpoint, data):
    _, records = data
    monkeypatch.setenv("MTMC_POLICY_CHECKPOINT", str(checkpoint))
    monkeypatch.delenv("MTMC_PLANNER", raising=False)
    monkeypatch.setattr(planner, "emit", lambda event: None)
    spec = _spec(records, "matmul")
    config = family_of(spec).default_config(spec, H200)
    state = _plan_state(spec, config)
    out = planner.plan(state, SimpleNamespace(context=Context(target="h200")))["decision"]
    loaded = learned.load_policy(checkpoint)
    _, cands, probs, _ = learned.score(loaded, spec, config, H200, tried={config_key(config)}, steps_taken=0,
                                       max_steps=8, last_verdict="start", resources=None)
    net = {"stop": float(probs[0]), **{c.action.label(): float(probs[i + 1]) for i, c in enumerate(cands)}}
    assert out["policy"] == loaded.name
    for alt in out["alternatives"]:
        assert alt["prob"] == pytest.approx(net[alt["action"]], abs=1e-4)
    top = max(net, key=net.get)
    assert out["alternatives"][0]["action"] == top
    # the baseline stays reachable, by the context or the environment
    out = planner.plan(state, SimpleNamespace(context=Context(target="h200", planner="baseline")))["decision"]
    assert out["policy"] == baseline.POLICY_NAME
    monkeypatch.setenv("MTMC_PLANNER", "baseline")
    out = planner.plan(state, SimpleNamespace(context=Context(target="h200")))["decision"]
    assert out["policy"] == baseline.POLICY_NAME


def test_the_explainer_shows_the_policys_numbers(checkpoint, data):
    from mtmc.agents.explainer import _decision
    _, records = data
    spec = _spec(records, "matmul")
    d = learned.decide(spec, family_of(spec).default_config(spec, H200), H200, tried=set(), measured=False,
                       steps_taken=0, max_steps=8, stale_steps=0, checkpoint=checkpoint).to_dict()
    text = "\n".join(_decision({**d, "step": 1}))
    assert learned.PREDICTION in text and "learned: PPO" in text and "validity" in text
    assert f"p={d['alternatives'][0]['prob']:.2f}" in text


def test_policy_eval_writes_its_report(tmp_path, checkpoint, data):
    from bench import policy_eval
    folder, _ = data
    assert policy_eval.main(["--data", str(folder), "--checkpoint", str(checkpoint), "--out", str(tmp_path),
                             "--name", "eval", "--random-seeds", "3", "--max-trials", "6", "--allow-unmeasured"]) == 0
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["legality"]["checked"] > 0 and report["legality"]["violations"] == []
    assert set(report["summary"]["all"]) >= {"policy", "baseline", "autotuner", "random"}
    assert set(report["summary"]) - {"all"} <= set(FAMILIES)
    assert "Legality on NVIDIA A100" in (tmp_path / "eval.md").read_text()


def test_train_is_reproducible(tmp_path, data):
    folder, _ = data
    outs = []
    for name in ("a.pt", "b.pt"):
        args = ["--data", str(folder), "--out", str(tmp_path / name), "--cost-epochs", "2", "--members", "1",
                "--iterations", "1", "--episodes", "8", "--allow-unmeasured"]
        assert train.main(args) == 0
        outs.append(torch.load(tmp_path / name, weights_only=True))
    a, b = outs
    for k, v in a["policy"]["state_dict"].items():
        assert torch.equal(v, b["policy"]["state_dict"][k]), k
    assert torch.equal(a["cost_model"]["nets"][0]["head.weight"], b["cost_model"]["nets"][0]["head.weight"])


def test_training_on_the_held_out_split_says_so(tmp_path, data):
    from bench import policy_eval
    folder, _ = data
    out = tmp_path / "all.pt"
    assert train.main(["--data", str(folder), "--out", str(out), "--cost-epochs", "2", "--members", "1",
                       "--iterations", "1", "--episodes", "8", "--allow-unmeasured", "--with-heldout"]) == 0
    meta = learned.load_policy(out).meta
    assert meta["trained_on_sets"] == ["train", "heldout"]
    loo = meta["cost_model"]["eval"]["leave_one_spec_out"]
    assert loo["specs"] > 0 and "heldout_in_sample" in meta["cost_model"]["eval"]
    assert policy_eval.main(["--data", str(folder), "--checkpoint", str(out), "--out", str(tmp_path),
                             "--name", "e", "--random-seeds", "2", "--max-trials", "4", "--allow-unmeasured"]) == 0
    assert "**In-sample:**" in (tmp_path / "e.md").read_text()
