"""A module's time budget (`mtmc optimize --time-budget`): KernelBench's level-3 networks plan
40-130 fusion groups, and a run that the benchmark's wall timeout killed left nothing.  With a
budget, groups whose turn comes too late stay PyTorch, planners stop moving, and ModelNew is still
written and checked."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from mtmc.agents import module_flow, planner
from mtmc.agents.context import Context
from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.tools.hardware import PROFILES

MODULES = Path(__file__).parent / "modules"


def test_the_planner_stops_once_the_modules_time_is_spent(monkeypatch):
    monkeypatch.setattr(planner, "emit", lambda event: None)
    spec = KernelSpec("softmax", "softmax", {"M": 64, "N": 1000}, "float32", {})
    config = family_of(spec).default_config(spec, PROFILES["h200"])
    best = {"config": config, "step": 0, "time_ms": 0.5, "verdict": {"ok": True, "measured": False}}
    state = {"spec": spec.to_dict(), "best": best, "steps": [{"step": 0, "origin": "template"}], "tried": [],
             "stale_steps": 0}
    moving = planner.plan(state, SimpleNamespace(context=Context(target="h200", deadline=time.time() + 600)))
    assert moving["decision"]["reason"] != "the module's time budget is spent"
    late = planner.plan(state, SimpleNamespace(context=Context(target="h200", deadline=time.time() - 1)))
    assert late["decision"]["action"]["kind"] == "stop"
    assert late["decision"]["reason"] == "the module's time budget is spent"


def test_a_group_whose_turn_comes_too_late_stays_pytorch(monkeypatch):
    events = []
    monkeypatch.setattr(module_flow, "emit", events.append)
    monkeypatch.setattr(module_flow, "kernel_graph", lambda: (_ for _ in ()).throw(AssertionError("ran")))
    spec = KernelSpec("elementwise", "relu", {"M": 4, "N": 8}, "float32", {})
    task = {"group": {"id": 3, "graph": "", "family": "elementwise", "nodes": ["relu"], "replaces": ["relu"],
                      "ops": ["relu (line 1)"], "spec": spec.to_dict(), "args": [], "inputs": [], "out": {}},
            "gpu": False, "deadline": time.time() + 20}   # less than the 30 s kept for the module check
    out = module_flow.group(task, SimpleNamespace(context=Context(budget_s=100)))
    assert out["outcomes"]["3"]["status"] == "fallback"
    assert "time budget (100 s)" in out["outcomes"]["3"]["reason"]


def test_optimize_with_a_spent_budget_still_writes_and_checks_model_new(tmp_path):
    new = tmp_path / "new.py"
    proc = subprocess.run([sys.executable, "-m", "mtmc.commands.cli", "optimize", str(MODULES / "mlp_gelu.py"),
                           "--out", str(new), "--json", "--time-budget", "1", "--no-time"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["status"] == "done" and summary["check"]["status"] == "passed"
    assert summary["groups"] and all(g["status"] == "fallback" and "time budget" in g["reason"]
                                     for g in summary["groups"])
    assert new.exists() and "class ModelNew(Model)" in new.read_text()


def test_the_costliest_specs_start_first():
    """A level-3 CNN fans out ~100 groups four at a time in graph order, so the budget went to the
    stem's small convs while the big ones waited; the roofline (times the groups sharing a spec)
    orders them now."""
    def group(gid, m, n):
        spec = KernelSpec("elementwise", "relu", {"M": m, "N": n}, "float32", {})
        return {"id": gid, "spec": spec.to_dict()}
    small, big, twice = group(0, 64, 64), group(1, 4096, 4096), group(2, 2048, 4096)
    state = {"groups": [small, big, twice, group(3, 2048, 4096)], "outcomes": {}, "gpu": False}
    sends = module_flow.fan_out(state)
    assert [s.arg["group"]["id"] for s in sends] == [1, 2, 0] or [s.arg["group"]["id"] for s in sends] == [2, 1, 0]
    # 2048x4096 twice costs what 4096x4096 once does; both come before the small one
    state["groups"] = [small, big, twice]
    assert [s.arg["group"]["id"] for s in module_flow.fan_out(state)] == [1, 2, 0]
    state["outcomes"] = {"1": {"status": "done"}}
    assert [s.arg["group"]["id"] for s in module_flow.fan_out(state)] == [2, 0]
