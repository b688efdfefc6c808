"""The product's measured drafts as policy data (bench.harvest): a GPU run's history in the
memory's log becomes dataset records the cost model reads, once per (spec, config, GPU)."""
from __future__ import annotations

import copy

from mtmc.kernels.spec import KernelSpec
from mtmc.memory.log import HistoryLog
from bench import harvest
from mtmc.policy import dataset
from mtmc.policy.cost_model import table
from mtmc.policy.features import Layout
from mtmc.request.parse import parse_request
from mtmc.tools.hardware import PROFILES

# a conv group's spec as the product builds it (the words parser makes the same spec as capture)
SPEC = {k: v for k, v in parse_request("a 3x3 conv with 16 in and 32 out channels on an 8x16x32x32 float32 "
                                       "input, then relu").spec.to_dict().items() if k != "request"}


def _report(regs: int, spills: int = 0) -> dict:
    return {"target": "NVIDIA H100 80GB HBM3", "arch": 90,
            "kernels": [{"name": "conv_kernel", "num_warps": 4, "num_stages": 2, "regs": regs,
                         "spill_bytes": spills, "shared_bytes": 32768, "occupancy": 0.5}]}


def _step(i: int, config: dict, verdict: dict) -> dict:
    return {"step": i, "config": config, "verdict": verdict, "time_ms": verdict.get("time_ms")}


def _history(hid: str = "conv-1", measured: bool = True, spec: dict = SPEC) -> dict:
    a = {"ALGO": "taps", "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
    b, c, d = {**a, "BLOCK_N": 128}, {**a, "num_warps": 8}, {**a, "BLOCK_K": 64}
    ok = lambda ms: {"ok": True, "stage": "done", "kind": None, "detail": "", "resources": _report(96),  # noqa: E731
                     "time_ms": ms, "measured": measured}
    return {"id": hid, "created": "2026-12-07T10:00:00+00:00", "request": "module group", "spec": {**spec, "request": "x"},
            "gpu": PROFILES["h100"].to_dict(), "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0"},
            "final_config": a, "final_step": 0, "source": "", "time_ms": 0.5, "measured": measured,
            "steps": [_step(0, a, ok(0.5)),
                      _step(1, b, {"ok": False, "stage": "compile", "kind": "register_spills",
                                   "detail": "spills 512 B per thread", "resources": _report(255, 512),
                                   "time_ms": None, "measured": False}),
                      _step(2, c, {"ok": False, "stage": "guard", "kind": "wrong_values", "detail": "mismatch",
                                   "resources": _report(80), "time_ms": None, "measured": False}),
                      _step(3, d, ok(0.42)),
                      _step(4, a, ok(0.51))]}   # the first config again (a rollback): one record


def _write(home, histories: list[dict]) -> None:
    log = HistoryLog(home / "memory" / "histories.jsonl")
    with log.writing() as append:
        for h in histories:
            append(h)


def test_a_measured_history_becomes_one_record_per_config():
    rows = harvest.records_from_history(_history(), "harvest-t")
    assert [r["stage"] for r in rows] == ["ok", "masked", "wrong", "ok"]
    assert [r["ms"] for r in rows] == [0.5, None, None, 0.42]
    assert [r["legal"] for r in rows] == [True, False, True, True]
    assert rows[1]["resources"]["spills"] == 512 and rows[0]["resources"]["regs"] == 96
    key = KernelSpec.from_dict(SPEC).key()
    assert {r["spec_key"] for r in rows} == {key} and {r["gpu"] for r in rows} == {"h100"}
    assert all(r["set"] == dataset.split_of(key) and "request" not in r["spec"] for r in rows)
    assert set(rows[0]) == set(dataset.FIELDS)


def test_estimates_and_custom_groups_are_not_data():
    assert harvest.records_from_history(_history(measured=False), "r") == []
    custom = {**SPEC, "family": "custom", "op": "custom"}
    assert harvest.records_from_history(_history(spec=custom), "r") == []


def test_harvest_appends_new_drafts_once_and_the_cost_model_reads_them(tmp_path):
    home, out = tmp_path / "home", tmp_path / "policy"
    _write(home, [_history("conv-1"), _history("conv-2", measured=False)])
    run = harvest.new_run()
    path, n = harvest.harvest([str(home)], out, run)
    assert n == 4 and path.name.startswith("2026-12-07-h100-harvest-")
    # a later task of the same benchmark run: only its new drafts, appended to the same file
    again = copy.deepcopy(_history("conv-3"))
    again["steps"][3]["config"] = {**again["steps"][3]["config"], "BLOCK_M": 64}
    _write(home, [again])
    path2, n2 = harvest.harvest([str(home)], out, run)
    assert (path2, n2) == (path, 1)
    assert harvest.harvest([str(home / "memory" / "histories.jsonl")], out) == (None, 0)
    rows = dataset.load(out)
    assert len(rows) == 5
    t = table(rows, Layout.build([KernelSpec.from_dict(SPEC)], [r["config"] for r in rows]))
    assert len(t.valid) == 5 and int(t.valid.sum()) == 3   # three timed configs, two invalid ones
