"""The policy's measurement dataset (mtmc.policy.dataset) and its collector (bench.collect), on the
CPU path: Triton's interpreter at small dims, resources from the offline sm_90 compile."""
from __future__ import annotations

import gzip
import json

import pytest

from bench import collect
from bench.collect_specs import all_specs, base_specs, configs_for, masked
from bench.collect_workers import Measurer
from mtmc.kernels.catalog import families, family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.policy import dataset
from mtmc.policy.actions import config_key
from mtmc.request.parse import parse_request
from mtmc.tools.hardware import PROFILES

H200 = PROFILES["h200"]


def _row(i: int, spec_key: str = "abc") -> dict:
    return {"spec_key": spec_key, "config_key": f"c{i}", "gpu": "h200", "device_name": "NVIDIA H200", "i": i}


# -- the dataset on disk ------------------------------------------------------------------
def test_records_round_trip_and_survive_a_truncated_last_member(tmp_path):
    path = tmp_path / dataset.file_name("2026-12-03", "h200", "r1")
    dataset.append(path, [_row(0), _row(1)])
    dataset.append(path, [_row(2)])
    dataset.append(path, [])   # nothing to write: no empty member
    assert [r["i"] for r in dataset.load(tmp_path)] == [0, 1, 2]
    whole = path.read_bytes()
    dataset.append(path, [_row(i) for i in range(3, 50)])
    path.write_bytes(path.read_bytes()[: len(whole) + 40])   # killed while writing the last batch
    assert [r["i"] for r in dataset.load(path)] == [0, 1, 2]
    with gzip.open(tmp_path / "other.jsonl.gz", "wt") as f:   # another machine's file merges by adding it
        f.write(json.dumps(_row(9, "def")) + "\n")
    assert sorted(r["i"] for r in dataset.load(tmp_path)) == [0, 1, 2, 9]
    assert dataset.done_keys(tmp_path, "h200") == {("abc", "c0", "h200"), ("abc", "c1", "h200"),
                                                  ("abc", "c2", "h200"), ("def", "c9", "h200")}
    assert dataset.done_keys(tmp_path, "h200", on_cpu=True) == set()   # unmeasured rows count apart
    assert dataset.done_keys(tmp_path, "a100") == set()


def test_heldout_split_is_deterministic_per_spec_and_about_a_fifth():
    keys = [KernelSpec("matmul", "matmul", {"M": m, "N": 64, "K": 64}).key() for m in range(1, 2001)]
    sets = [dataset.split_of(k) for k in keys]
    assert sets == [dataset.split_of(k) for k in keys]
    assert 0.16 < sets.count("heldout") / len(sets) < 0.24
    entries = all_specs(["elementwise", "reduction"], 10, seed=3)
    for e in entries:
        assert e.set == dataset.split_of(e.spec.key())
    for fam in ("elementwise", "reduction"):   # stratified: each family holds out its fifth
        mine = [e for e in entries if e.spec.family == fam]
        assert len(mine) == 10 and sum(e.set == "heldout" for e in mine) == 2
    assert [e.spec.key() for e in all_specs(["elementwise", "reduction"], 10, seed=3)] == [e.spec.key() for e in entries]


# -- specs and configs --------------------------------------------------------------------
def test_specs_cover_every_catalog_family_and_fit():
    assert {s.family for s in base_specs()} == set(families()), "a family has no request in bench/tasks.py"
    entries = all_specs(None, 6, seed=0, max_bytes=2**30)
    by_family = {}
    for e in entries:
        by_family.setdefault(e.spec.family, []).append(e)
        fam = family_of(e.spec)
        fam.validate(e.spec)
        assert fam.tensor_bytes(e.spec) <= 2**30
    assert {f: len(v) for f, v in by_family.items()} == {f: 6 for f in families()}
    # rescaled: more shapes than the requests, odd sizes among them, and other dtypes
    assert len({e.spec.key() for e in entries}) == len(entries)
    assert any(v % 2 for e in entries for k, v in e.spec.dims.items() if v > 1)
    assert {e.spec.dtype for e in entries} == {"float32", "float16", "bfloat16"}


def test_configs_default_neighbours_random_and_exhaustive_heldout():
    entry = all_specs(["elementwise"], 1, seed=0)[0]
    fam = family_of(entry.spec)
    default = fam.default_config(entry.spec, H200)
    configs = configs_for(entry, H200, per_spec=5, exhaustive_heldout=200, seed=0)
    keys = [config_key(c) for c in configs]
    assert len(set(keys)) == len(keys) and configs[0] == default
    assert any(c["BLOCK"] == default["BLOCK"] * 2 and c["num_warps"] == default["num_warps"] for c in configs)
    entry.set = "heldout"   # a held-out spec with a small product gets all of it
    space = fam.config_space(entry.spec)
    product = 1
    for v in space.values():
        product *= len(v)
    assert len(configs_for(entry, H200, 5, exhaustive_heldout=200, seed=0)) == product


def test_the_resource_model_masks_what_cannot_run():
    spec = parse_request("matmul 4096x4096 by 4096x4096 in fp16").spec
    fam = family_of(spec)
    ok = fam.default_config(spec, H200)
    huge = {**ok, "BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "num_stages": 5}
    assert masked(spec, ok, H200) is None
    assert "shared memory" in masked(spec, huge, H200)


# -- measuring ----------------------------------------------------------------------------
def test_measurer_survives_wrong_raising_crashing_poisoning_and_hanging_configs():
    spec = parse_request("relu on a 4x8 fp32 tensor").spec
    fam = family_of(spec)
    good = fam.render(spec, fam.default_config(spec, H200))
    # a CUDA error that breaks the context, as the measuring process sees it: its check says so
    poison = ("import sys\n"
              "def launch(x, out):\n"
              "    sys.modules['bench.collect_workers'].SpecBench.broken = lambda self: True\n"
              "    raise RuntimeError('CUDA error: an illegal memory access was encountered')\n")
    sources = {
        "good": good,
        "zeros": "def launch(x, out):\n    out.zero_()\n",
        "raises": "def launch(x, out):\n    raise RuntimeError('boom')\n",
        "clobbers": "def launch(x, out):\n    out.copy_(x.clamp(min=0))\n    x.zero_()\n",
        "crashes": "import os\ndef launch(x, out):\n    os._exit(7)\n",
        "after_crash": good,
        "poisons": poison,
        "after_poison": good,
        "hangs": "import time\ndef launch(x, out):\n    time.sleep(120)\n",
    }
    items = [{"key": k, "source": s, "dims": dict(spec.dims)} for k, s in sources.items()]
    m = Measurer("cpu", interpret=True, item_timeout_s=5, setup_timeout_s=120)
    try:
        rows, why = m.measure(spec.to_dict(), items)
    finally:
        m.stop()
    assert why is None
    stages = {k: r["stage"] for k, r in rows.items()}
    assert stages == {"good": "ok", "zeros": "wrong", "raises": "wrong", "clobbers": "wrong", "crashes": "wrong",
                      "after_crash": "ok", "poisons": "wrong", "after_poison": "ok", "hangs": "timeout"}, rows
    assert "boom" in rows["raises"]["error"] and "input 0 was modified" in rows["clobbers"]["error"]
    assert "exit code 7" in rows["crashes"]["error"] and "illegal memory access" in rows["poisons"]["error"]
    assert m.restarts == 3 and rows["good"]["ms"] is None   # no timing without a GPU


def test_gpu_timing_path_do_bench_or_one_run_for_slow_configs(monkeypatch):
    """The measuring process's GPU branch with the CUDA calls stood in for: do_bench's median for
    a normal config, one timed run for one whose first launch was slow."""
    from bench import collect_workers
    from mtmc.tools import correctness, timing
    spec = parse_request("relu on a 4x8 fp32 tensor").spec
    bench = collect_workers.SpecBench(spec.to_dict(), "cpu", 5, 25)
    bench.inputs(spec.dims)              # drawn here on the host, then used as if on the GPU
    bench.device, bench._sync = "cuda", lambda: None
    real_poisoned = correctness.poisoned_output
    monkeypatch.setattr(correctness, "poisoned_output", lambda task, dims, device: real_poisoned(task, dims, "cpu"))
    calls = []
    monkeypatch.setattr(timing, "bench_ms", lambda fn, warmup_ms, rep_ms: calls.append((warmup_ms, rep_ms)) or 0.25)
    monkeypatch.setattr(collect_workers, "once_ms", lambda fn: 400.0)
    fast = "def launch(x, out):\n    out.copy_(x.clamp(min=0))\n"
    slow = "import time\ndef launch(x, out):\n    time.sleep(0.6)\n    out.copy_(x.clamp(min=0))\n"
    assert bench.measure(fast, dict(spec.dims)) == {"stage": "ok", "error": None, "ms": 0.25, "poisoned": False}
    assert calls == [(5, 25)]
    assert bench.measure(slow, dict(spec.dims))["ms"] == 400.0 and len(calls) == 1


def test_tiny_cpu_collection_writes_every_field_and_resumes(tmp_path, monkeypatch, capsys):
    planted = {"compile": {"num_warps": 3},            # Triton refuses: not a power of two
               "masked": {"BLOCK": 16384, "num_warps": 1},   # the mask says no: recorded unmeasured
               "sampled": {"BLOCK": 512, "num_warps": 1}}    # masked, but in the measured sample
    real_configs = collect.configs_for

    def configs_with_plants(entry, *args, **kw):
        out = real_configs(entry, *args, **kw)
        if entry.spec.family != "elementwise":
            return out
        return out + [{**out[0], **p} for p in planted.values()]

    def fake_mask(spec, cfg, hw):   # the collector's bookkeeping of the mask, on chosen configs
        return "planted" if cfg.get("num_warps") == 1 and cfg["BLOCK"] in (512, 16384) else None

    monkeypatch.setattr(collect, "configs_for", configs_with_plants)
    monkeypatch.setattr(collect, "masked", fake_mask)
    monkeypatch.setattr(collect, "sample_masked", lambda spec_key, ck, seed: '"BLOCK": 512' in ck)
    argv = ["--cpu", "--families", "elementwise,reduction", "--specs-per-family", "1", "--max-configs", "1",
            "--workers", "1", "--budget-s", "300", "--out", str(tmp_path)]
    assert collect.main(argv) == 0
    rows = dataset.load(tmp_path)
    assert len(list(tmp_path.glob("*-cpu-*.jsonl.gz"))) == 1
    for r in rows:
        assert set(r) == set(dataset.FIELDS) and set(r["resources"]) == set(dataset.RESOURCE_FIELDS)
        assert r["stage"] in dataset.STAGES and r["measured"] is False and r["ms"] is None
        assert r["gpu"] == "h200" and r["device_name"] == "cpu" and r["set"] == dataset.split_of(r["spec_key"])
        assert r["spec_key"] == KernelSpec.from_dict(r["spec"]).key() and "request" not in r["spec"]
        assert r["config_key"] == config_key(r["config"]) and r["versions"]["torch"]
    assert {r["family"] for r in rows} == {"elementwise", "reduction"}
    by = {(r["config"]["num_warps"], r["config"]["BLOCK"]): r for r in rows if r["family"] == "elementwise"}
    assert [r["stage"] for (w, _), r in by.items() if w == 3] == ["compile_error"]
    assert by[1, 16384]["stage"] == "masked" and not by[1, 16384]["legal"] and by[1, 16384]["resources"]["regs"] is None
    assert by[1, 512]["stage"] == "ok" and not by[1, 512]["legal"] and by[1, 512]["resources"]["regs"]
    ok = [r for r in rows if r["stage"] == "ok" and r["legal"]]
    assert len(ok) >= 2 and all(r["resources"]["regs"] and r["resources"]["threads"] for r in ok)
    first = capsys.readouterr().out
    assert "configs/s" in first and "elementwise" in first
    # resume: everything is in the folder already, so a second run adds nothing
    assert collect.main(argv) == 0
    assert len(dataset.load(tmp_path)) == len(rows)
    assert len(list(tmp_path.glob("*.jsonl.gz"))) == 1


def test_plan_counts_without_compiling(capsys):
    assert collect.main(["--plan", "--families", "matmul,scan", "--specs-per-family", "3", "--budget-s", "60",
                         "--out", "/nonexistent-policy-data"]) == 0
    out = capsys.readouterr().out
    assert "matmul" in out and "scan" in out and "covers about" in out


class _FakePool:
    """Compiles nothing: every config 'compiles' to a placeholder source with fixed resources."""

    def apply_async(self, fn, args):
        class Done:
            def get(self, timeout=None):
                return {"source": f"# {args[1]}", "error": None,
                        "resources": {"regs": 32, "spills": 0, "smem": 0, "threads": 128, "occupancy": 1.0}}
        return Done()

    def terminate(self):
        pass


class _FakeGpuMeasurer:
    """Stands in for the measuring process on a GPU: every config 'ran' in 0.01 ms per place."""
    seen: list = []

    def __init__(self, device, interpret, **options):
        self.device, self.interpret, self.restarts = device, interpret, 0

    def measure(self, spec, items, deadline=None):
        _FakeGpuMeasurer.seen.append((self.device, self.interpret, spec, [it["dims"] for it in items]))
        return {it["key"]: {"stage": "ok", "error": None, "ms": 0.01 * (i + 1)} for i, it in enumerate(items)}, None

    def stop(self):
        pass


def test_gpu_run_bookkeeping_full_dims_measured_rows_and_budget(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(collect, "Measurer", _FakeGpuMeasurer)
    monkeypatch.setattr(collect.Collector, "pool", lambda self: _FakePool())
    entries = all_specs(["elementwise", "scan"], 2, seed=0)
    args = collect.parse_args(["--out", str(tmp_path), "--max-configs", "4"])
    assert collect.Collector(args, "NVIDIA H200", H200, "h200", set()).run(entries) == 0
    rows = dataset.load(tmp_path)
    assert len(rows) == 16 and len(list(tmp_path.glob("*-h200-*.jsonl.gz"))) == 1
    assert all(r["measured"] and r["ms"] > 0 and r["device_name"] == "NVIDIA H200" for r in rows)
    for device, interpret, spec, dims in _FakeGpuMeasurer.seen:   # real size on the GPU, no interpreter
        assert device == "cuda" and not interpret and all(d == spec["dims"] for d in dims)
    # a budget too small for the next spec starts none
    done = dataset.done_keys(tmp_path, "h200")
    args = collect.parse_args(["--out", str(tmp_path), "--max-configs", "8", "--budget-s", "0.1"])
    assert collect.Collector(args, "NVIDIA H200", H200, "h200", done).run(entries) == 0
    assert len(dataset.load(tmp_path)) == 16 and "stopped: the budget is near" in capsys.readouterr().out


def test_collection_shards_over_a_dask_cluster_without_losing_or_repeating_rows(tmp_path):
    """--gpus N: one shard of the specs per worker, each writing its own run file; a second run
    resumes from those files and measures nothing again (issue 19: collection as Dask tasks)."""
    pytest.importorskip("distributed")
    argv = ["--cpu", "--families", "elementwise,reduction", "--specs-per-family", "1", "--max-configs", "1",
            "--workers", "2", "--budget-s", "300", "--out", str(tmp_path), "--gpus", "2"]
    assert collect.shard_argv(argv, 1, 2, 1)[-4:] == ["--workers", "1", "--shard", "1/2"]
    assert "--gpus" not in collect.shard_argv(argv, 1, 2, 1)
    assert collect.main(argv) == 0
    rows = dataset.load(tmp_path)
    assert {r["family"] for r in rows} == {"elementwise", "reduction"}
    keys = [(r["spec_key"], r["config_key"]) for r in rows]
    assert len(keys) == len(set(keys))
    assert len(list(tmp_path.glob("*.jsonl.gz"))) == 2       # one file per shard
    assert collect.main(argv) == 0
    assert len(dataset.load(tmp_path)) == len(rows)
