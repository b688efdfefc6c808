"""bench.kernelbench: the KernelBench runner end to end on tiny tasks (CPU, Triton's interpreter),
the evaluation job's verdicts, and the per-level totals on hand-made records."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import kernelbench as kb
from mtmc.tools.isolation import Confinement
from mtmc.tools.worker import run_job

TINY = Path(__file__).parent / "kernelbench_tiny"
REPO = Path(__file__).resolve().parents[1]
TASKS = ["level1/1_ReLU.py", "level1/2_Softmax.py", "level2/1_Gemm_ReLU.py"]


def _bench(tmp_path, *args):
    cmd = [sys.executable, "-m", "bench.kernelbench", str(TINY), "--device", "cpu", "--max-steps", "0",
           "--results-dir", str(tmp_path), "--out", "tiny", *args]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def _records(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "tiny.jsonl").read_text().splitlines()]


def _processes_naming(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(cmdline)
    return found


def test_the_runner_records_every_task_skips_finished_ones_and_redoes_on_request(tmp_path):
    out = _bench(tmp_path)
    records = _records(tmp_path)
    assert [r["task"] for r in records] == TASKS
    for r in records:
        assert r["optimize"]["status"] == "done" and r["optimize"]["kernels"] == r["optimize"]["groups"] == 1
        assert r["eval"]["status"] == "ok" and len(r["eval"]["trials"]) == 3
        assert r["correct_1e-2"] is True and r["correct_1e-4"] is True
        assert r["eval"]["max_abs_err"] < 1e-4
        assert r["triton_kernel"] is True and sum(r["eval"]["triton"]["launches"].values()) >= 1
        assert r["new_ms"] is None and r["speedup_vs_eager"] is None   # no GPU: not measured
    assert "[3/3] level2/1_Gemm_ReLU.py: optimize done" in out
    md = (tmp_path / "tiny.md").read_text()
    assert "| level1 | 2 | 2 (100%) | 2 (100%) | 2 (100%) | 2 (100%) |" in md
    assert "| level2 | 1 | 1 (100%) | 1 (100%) | 1 (100%) | 1 (100%) |" in md
    assert "| all | 3 | 3 (100%) |" in md
    summary = json.loads((tmp_path / "tiny.json").read_text())
    assert summary["levels"]["all"]["correct_1e-4"] == 3 and summary["meta"]["python"]
    assert len(summary["rows"]) == 3

    again = _bench(tmp_path)
    assert "3 already recorded" in again and "0 to run" in again
    assert len(_records(tmp_path)) == 3

    # --redo runs the task again; a timeout that short ends optimize, and kills what it started
    redo = _bench(tmp_path, "--redo", "--only", "level1/1_ReLU.py", "--timeout", "3")
    assert "[1/1] level1/1_ReLU.py: optimize timed out" in redo
    records = _records(tmp_path)
    assert len(records) == 4 and records[-1]["task"] == "level1/1_ReLU.py"
    assert records[-1]["optimize"]["status"] == "timed out" and records[-1]["eval"] is None
    assert not records[-1]["correct_1e-2"]
    assert not _processes_naming(str(TINY / "level1" / "1_ReLU.py"))
    md = (tmp_path / "tiny.md").read_text()   # the task's last record counts
    assert "| level1 | 2 | 1 (50%) | 1 (50%) | 1 (50%) | 1 (50%) |" in md


def _eval(tmp_path, forward: str) -> dict:
    task = TINY / "level1" / "1_ReLU.py"
    new = tmp_path / "new.py"
    new.write_text(task.read_text() + f"\n\nclass ModelNew(Model):\n    def forward(self, x):\n        return {forward}\n")
    r = run_job({"kind": "module_eval", "path": str(task), "new_path": str(new), "device": "cpu"}, 120,
                memory_mb=kb.CPU_MEMORY_MB, interpret=True, confine=Confinement(ro=[str(task), str(new)]))
    assert r["status"] == "ok", r
    return r["result"]


def test_the_evaluation_job_judges_both_tolerances(tmp_path):
    zeros = _eval(tmp_path, "torch.zeros_like(x)")
    assert zeros["correct"] == {"1e-2": False, "1e-4": False}
    assert zeros["max_abs_err"] > 0.5 and zeros["max_rel_err"] == pytest.approx(1.0)
    assert zeros["triton"]["ours"] is False and zeros["new_ms"] is None

    off = _eval(tmp_path, "torch.relu(x) * (1 + 1e-3)")   # 1e-3 relative: inside 1e-2, outside 1e-4
    assert off["correct"] == {"1e-2": True, "1e-4": False}
    assert off["max_rel_err"] == pytest.approx(1e-3, rel=1e-2)
    assert len(set(off["seeds"])) == 4
    # off at 1e-4: which one is off from the float64 Model (L2 15 on the H100: Model's TF32 conv)
    assert off["float64"]["new"] == pytest.approx(1e-3, rel=1e-2) and off["float64"]["model"] < 1e-6
    # off at 1e-2 too (L3 49 Mamba2 on the H100, where Model's own fp32 output misses float64 at 1e-2)
    assert zeros["float64"]["new"] == pytest.approx(1.0) and zeros["float64"]["model"] < 1e-6
    note = kb.task_table([{**_rec("level2/15_x.py"), "eval": {"status": "ok", "float64": {"new": 2e-7, "model": 4.1e-4}}}])
    assert "against float64 Model: ModelNew 2.0e-07, Model 4.1e-04 of the largest value" in note[-1]


# -- totals on hand-made records ----------------------------------------------------------------

def _rec(task, status="done", correct=True, eager=None, compile_=None, share=None, seconds=10.0):
    level = int(task.split("/")[0].removeprefix("level"))
    return {"task": task, "level": level, "optimize": {"status": status, "seconds": seconds},
            "correct_1e-2": correct, "correct_1e-4": correct, "triton_kernel": correct, "triton_share": share,
            "speedup_vs_eager": eager, "speedup_vs_compile": compile_}


RECORDS = [_rec("level1/1_a.py", eager=4.0, compile_=2.0, share=0.9, seconds=10),
           _rec("level1/2_b.py", eager=0.5, compile_=0.25, share=0.5, seconds=30),
           _rec("level1/3_c.py", status="failed", correct=False, seconds=50),
           _rec("level1/4_d.py", status="done", correct=False, eager=10.0, compile_=10.0, seconds=70),
           _rec("level2/1_e.py", status="timed out", correct=False, seconds=300)]


def test_geomean_and_fast_1_count_failed_tasks_as_the_conventions_say():
    level1 = kb.by_level(RECORDS)["level1"]
    assert level1["tasks"] == 4 and level1["optimize_done"] == 3 and level1["correct_1e-2"] == 2
    e, c = level1["vs_eager"], level1["vs_compile"]
    assert e["fast_1"] == 1 and c["fast_1"] == 1   # an incorrect task is never fast, however quick
    assert e["geomean_correct"] == pytest.approx(math.sqrt(4.0 * 0.5)) and e["correct_n"] == 2
    assert e["geomean_all"] == pytest.approx((4.0 * 0.5 * 1.0 * 1.0) ** 0.25)
    assert c["geomean_correct"] == pytest.approx(math.sqrt(2.0 * 0.25))
    assert c["geomean_all"] == pytest.approx((2.0 * 0.25) ** 0.25)
    assert level1["triton_share_mean"] == pytest.approx(0.7)
    assert level1["optimize_s_median"] == 40 and level1["optimize_s_max"] == 70
    level2 = kb.by_level(RECORDS)["level2"]
    assert level2["vs_eager"] == {"fast_1": None, "geomean_correct": None, "correct_n": 0, "geomean_all": None}
    assert kb.by_level(RECORDS)["all"]["tasks"] == 5


def test_the_level_table_shows_both_conventions():
    rows = kb.level_table(kb.by_level(RECORDS))
    level1 = next(r for r in rows if r.startswith("| level1 |"))
    assert "| 4 | 3 (75%) | 2 (50%) | 2 (50%) | 2 (50%) | 0.70 (2) | 1 (25%) | 1 (25%) " in level1
    assert "| 1.41x (2) / 1.19x |" in level1 and "| 40 / 70 |" in level1
    assert "| - (0) / - |" in next(r for r in rows if r.startswith("| level2 |"))


def test_speedups_come_from_the_faster_compile_mode_or_eager_when_none_compiled():
    base = {"eager": {"ms": 2.0}, "default": {"ms": 1.5}, "max-autotune-no-cudagraphs": {"ms": 1.0}}
    record = {"eval": {"status": "ok", "correct": {"1e-2": True, "1e-4": False}, "new_ms": 0.5,
                       "triton": {"ours": True, "gpu_share": 0.8}}, "baselines": base}
    o = kb.outcome(record)
    assert o["speedup_vs_eager"] == 4.0 and o["speedup_vs_compile"] == 2.0
    assert o["compile_mode"] == "max-autotune-no-cudagraphs" and o["correct_1e-4"] is False
    failed = {**base, "default": {"ms": None}, "max-autotune-no-cudagraphs": {"ms": None}}
    assert kb.compile_baseline(failed) == (2.0, "eager (no mode compiled)")
    crashed = kb.outcome({"eval": {"status": "crashed", "message": "boom"}, "baselines": None})
    assert crashed["correct_1e-2"] is False and crashed["speedup_vs_eager"] is None


def test_baselines_are_measured_once_per_task_gpu_and_versions(tmp_path, monkeypatch):
    measured = []

    def fake(task, mode, timeout_s):
        measured.append(mode)
        return {"status": "timed out" if mode == "default" else "ok", "ms": 1.0, "timeout_s": timeout_s}
    monkeypatch.setattr(kb, "measure_baseline", fake)
    task = kb.Task("level1/1_a.py", 1, tmp_path / "a.py")
    env = {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6"}
    kb.baselines(task, "sha", kb.BaselineCache(tmp_path / "b.jsonl", env), 60)
    assert measured == list(kb.BASELINE_MODES)
    kb.baselines(task, "sha", kb.BaselineCache(tmp_path / "b.jsonl", env), 60)   # a later run: from the file
    assert len(measured) == 3
    kb.baselines(task, "sha", kb.BaselineCache(tmp_path / "b.jsonl", env), 600)  # a longer timeout retries
    assert measured[3:] == ["default"]
    kb.baselines(task, "sha", kb.BaselineCache(tmp_path / "b.jsonl", {**env, "torch": "2.13"}), 60)
    assert len(measured) == 7
    measured.clear()   # a time-limited run may time one compile mode only
    kb.baselines(kb.Task("level1/2_b.py", 1, tmp_path / "b.py"), "sha2", kb.BaselineCache(tmp_path / "b.jsonl", env),
                 60, modes=("default",))
    assert measured == ["eager", "default"]
    assert kb.parse_args(["--compile-modes", "default"]).compile_modes == ["default"]


def test_tasks_are_found_in_level_and_number_order_and_filtered(tmp_path):
    for rel in ("level1/10_b.py", "level1/2_a.py", "level2/1_c.py", "level3/5_a.py", "notes/x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    rels = lambda **kw: [t.rel for t in kb.find_tasks(tmp_path, **kw)]
    assert rels() == ["level1/2_a.py", "level1/10_b.py", "level2/1_c.py", "level3/5_a.py"]
    assert rels(levels=[2, 3]) == ["level2/1_c.py", "level3/5_a.py"]
    assert rels(only=["*_a.py"]) == ["level1/2_a.py", "level3/5_a.py"]
    assert rels(only=["level1/1"]) == ["level1/10_b.py"]
    assert rels(limit=2) == ["level1/2_a.py", "level1/10_b.py"]


def test_group_outcomes_are_kept_from_the_optimize_log(tmp_path):
    log = tmp_path / "optimize.log"
    log.write_text("capture ...\n== group 1: relu (elementwise) N=10\n  step 1 ...\n"
                   "== group 1: pytorch (ours 2.1 ms vs eager 2.0 ms)\n[module check] skipped: no kernel\n")
    assert kb.group_outcomes(log) == ["== group 1: relu (elementwise) N=10", "== group 1: pytorch (ours 2.1 ms vs eager 2.0 ms)",
                                      "[module check] skipped: no kernel"]
    assert kb.group_outcomes(tmp_path / "missing.log") == []


def test_a_killed_optimize_writes_its_temporary_files_where_the_runner_removes_them(tmp_path):
    """A run killed at its timeout cannot clean up after itself (on the H200 three such runs left
    the guard's multi-GB exchange files behind and filled the disk): its TMPDIR is the runner's."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    writer = ("import os, tempfile, time\n"
              "d = tempfile.mkdtemp(prefix='mtmc-guard-')\n"
              "open(os.path.join(d, 'staged.pt'), 'wb').write(b'x' * 4096)\n"
              "print(d, flush=True)\n"
              "time.sleep(60)\n")
    out = kb.run_optimize([sys.executable, "-c", writer], tmp_path / "log", timeout_s=3, scratch=scratch)
    assert out["status"] == "timed out"
    left = list(scratch.iterdir())   # it wrote where the runner said, inside the task's own
    assert len(left) == 1 and left[0].name.startswith("mtmc-guard-")   # directory, which run_task removes


def test_optimize_log_is_kept_whole_and_its_progress_lines_are_timed(tmp_path):
    """stderr goes to the log as written, the step lines with their second of arrival; stdout's
    JSON summary is read apart from it."""
    child = ("import sys, time, json\n"
             "print('[code]   step 0: config', file=sys.stderr, flush=True)\n"
             "time.sleep(0.6)\n"
             "print('a traceback line', file=sys.stderr, flush=True)\n"
             "print('== group 0: kernel (the catalog serves it)', file=sys.stderr, flush=True)\n"
             "print(json.dumps({'status': 'done', 'groups': [{'status': 'kernel'}], 'check': {'status': 'passed'}}))\n")
    out = kb.run_optimize([sys.executable, "-c", child], tmp_path / "log", timeout_s=60)
    assert out["status"] == "done" and out["kernels"] == 1 and out["check"] == "passed"
    assert (tmp_path / "log").read_text().splitlines() == [
        "[code]   step 0: config", "a traceback line", "== group 0: kernel (the catalog serves it)"]
    (t0, first), (t1, second) = out["timeline"]
    assert first.startswith("[code]") and second.startswith("== group 0") and t1 - t0 >= 0.5


def test_records_default_to_one_file_per_kind_of_gpu():
    """The device tool may lend an H100 for an H200 call: its rows must not join the H200 table."""
    from bench.kernelbench import gpu_slug
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "h100" and gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("NVIDIA A100-SXM4-80GB") == "a100" and gpu_slug("Tesla T4") == "tesla_t4"


def test_the_optimize_command_is_the_users_with_the_budget_and_the_asked_actions(tmp_path):
    task = kb.Task("level3/9_net.py", 3, tmp_path / "net.py")
    cmd = kb.optimize_command(task, tmp_path / "new.py", 2, None, 200.0)
    assert cmd[2:5] == ["mtmc.commands.cli", "optimize", str(tmp_path / "net.py")]
    assert cmd[cmd.index("--time-budget") + 1] == "170" and "--no-time" in cmd and "--cuda-graph" not in cmd
    assert "--cuda-graph" in kb.optimize_command(task, tmp_path / "new.py", 2, None, 200.0, cuda_graph=True)
    assert "--allow-tf32" not in cmd
    assert "--allow-tf32" in kb.optimize_command(task, tmp_path / "new.py", 2, None, 200.0, allow_tf32=True)
