"""The Dask engine (mtmc.tools.cluster) and the KernelBench runner on it, on CPU worker processes:
a worker killed mid-task or a hung task loses only its task, which is tried again elsewhere; the
results file gets every task once; a second run skips what is recorded."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")

import cluster_tasks  # noqa: E402  (the workers import it by name)
from mtmc.commands import optimize  # noqa: E402
from mtmc.memory import MemoryUnavailable, Store  # noqa: E402
from mtmc.memory import shared  # noqa: E402
from mtmc.tools.cluster import ClusterOptions, Engine  # noqa: E402
from test_memory import synthetic_record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    home = str(tmp_path_factory.mktemp("workers-home"))   # never the real ~/.mtmc
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MTMC_HOME", home)
        opts = ClusterOptions(workers=2, retries=1, env={"MTMC_TEST_ENV": "set", "MTMC_HOME": home}, cpu_only=True)
        with Engine.open(opts) as e:
            yield e


def _kill_when_started(folder: str, name: str) -> threading.Thread:
    """SIGKILL the worker process that starts task `name` first (once)."""
    def kill():
        while not cluster_tasks.started(folder, name):
            time.sleep(0.05)
        os.kill(cluster_tasks.started(folder, name)[0], signal.SIGKILL)
    t = threading.Thread(target=kill, daemon=True)
    t.start()
    return t


def test_a_killed_worker_loses_only_its_task_which_runs_again(engine, tmp_path):
    assert "2 worker(s), CPU only" in engine.describe() and "dashboard" in engine.describe()
    killer = _kill_when_started(str(tmp_path), "b")
    items = [(n, (n, str(tmp_path), s)) for n, s in (("a", 0.5), ("b", 3.0), ("c", 0.5), ("d", 0.5))]
    said = []
    done = {d.key: d for d in engine.map(cluster_tasks.sleepy, items, say=said.append)}
    killer.join(1)
    assert sorted(done) == ["a", "b", "c", "d"] and not any(d.error for d in done.values())
    assert done["b"].attempts == 2 and [d.attempts for k, d in done.items() if k != "b"] == [1, 1, 1]
    started, again = cluster_tasks.started(str(tmp_path), "b"), done["b"].result["pid"]
    killed = [p for p in started if p != again]
    assert len(started) == 2 and len(killed) == 1 and not psutil.pid_exists(killed[0])
    assert all(d.result["env"] == "set" for d in done.values())   # the run's environment reaches every task
    assert any("b: try 1 lost" in line for line in said)


def test_a_hung_task_gets_its_worker_killed_and_is_given_up_after_its_retries(engine, tmp_path):
    engine.opts = dataclasses.replace(engine.opts, hang_s=3.0, retries=0)
    try:
        done = list(engine.map(cluster_tasks.sleepy, [("h", ("h", str(tmp_path), 600)),
                                                      ("q", ("q", str(tmp_path), 0.2))]))
    finally:
        engine.opts = dataclasses.replace(engine.opts, hang_s=None, retries=1)
    by = {d.key: d for d in done}
    assert by["q"].result["task"] == "q" and by["h"].result is None and "hung" in by["h"].error
    assert not any(psutil.pid_exists(p) for p in cluster_tasks.started(str(tmp_path), "h"))


def test_an_existing_scheduler_is_used_by_its_address(engine, tmp_path):
    address = engine.client.scheduler.address
    engine.client.wait_for_workers(2, timeout=60)   # a worker killed by an earlier test is back
    with Engine.open(ClusterOptions(scheduler=address)) as remote:
        assert remote.describe().startswith(f"Dask: {address}, 2 worker(s), CPU only")
        done = list(remote.map(cluster_tasks.sleepy, [("r", ("r", str(tmp_path), 0.1))]))
    assert done[0].result["task"] == "r" and done[0].worker in engine.workers()


QUICK = "this is not python\n"   # `mtmc optimize` rejects it at once
SLOW = "import time\ntime.sleep(5)\nraise RuntimeError('a task that takes a while and is then rejected')\n"


def _optimize_processes(name: str) -> list:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "mtmc.commands.cli optimize" in cmd and name in cmd:
            out.append(p)
    return out


def test_kernelbench_on_workers_survives_a_killed_worker_and_resumes(tmp_path):
    folder = tmp_path / "kb"
    (folder / "level1").mkdir(parents=True)
    for name, text in (("1_Quick.py", QUICK), ("2_Slow.py", SLOW)):
        (folder / "level1" / name).write_text(text)
    cmd = [sys.executable, "-m", "bench.kernelbench", str(folder), "--device", "cpu", "--workers", "2",
           "--results-dir", str(tmp_path / "res"), "--out", "kb", "--timeout", "120"]
    victims = []

    def kill_the_slow_tasks_worker():
        deadline = time.time() + 120
        while time.time() < deadline:
            found = _optimize_processes("2_Slow.py")
            if found:
                victims.append(found[0])
                os.kill(found[0].ppid(), signal.SIGKILL)   # its parent: the Dask worker process
                return
            time.sleep(0.1)
    killer = threading.Thread(target=kill_the_slow_tasks_worker, daemon=True)
    killer.start()
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    killer.join(1)
    assert victims, run.stdout
    time.sleep(0.5)
    assert not victims[0].is_running() or victims[0].status() == psutil.STATUS_ZOMBIE   # died with its worker
    assert "Dask: a local cluster, 2 worker(s)" in run.stdout and "2_Slow.py: try 1 lost" in run.stdout
    lines = [json.loads(ln) for ln in (tmp_path / "res" / "kb.jsonl").read_text().splitlines()]
    assert sorted(r["task"] for r in lines) == ["level1/1_Quick.py", "level1/2_Slow.py"]
    assert {r["task"]: r["attempts"] for r in lines}["level1/2_Slow.py"] == 2
    assert all(r["optimize"]["status"] == "rejected" for r in lines)
    assert json.loads((tmp_path / "res" / "kb.json").read_text())["levels"]["all"]["tasks"] == 2

    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 already recorded" in again.stdout and "0 to run" in again.stdout
    assert len((tmp_path / "res" / "kb.jsonl").read_text().splitlines()) == 2


def test_a_folder_of_modules_on_workers_writes_each_once_and_resumes(engine, tmp_path, capsys):
    src = tmp_path / "models"
    (src / "sub").mkdir(parents=True)
    (src / "a.py").write_text(QUICK)
    (src / "sub" / "b.py").write_text(QUICK)
    (src / "_helper.py").write_text("X = 1\n")
    args = batch_args(src, tmp_path / "out")
    assert optimize.run_batch(args, engine) == 0
    out = capsys.readouterr().out
    assert "2 module(s)" in out and "2 to optimize" in out
    lines = [json.loads(ln) for ln in (tmp_path / "out" / "batch.jsonl").read_text().splitlines()]
    assert sorted(r["module"] for r in lines) == ["a.py", "sub/b.py"]
    assert all(r["status"] == "rejected" and r["worker"].startswith("tcp://") for r in lines)
    assert (tmp_path / "out" / "sub" / "b.log").exists()   # written here, from the task's text
    assert optimize.run_batch(args, engine) == 0
    assert "2 already recorded" in capsys.readouterr().out
    (src / "a.py").write_text(QUICK + "# changed\n")      # a changed module is optimized again
    assert optimize.run_batch(args, engine) == 0
    assert "1 to optimize" in capsys.readouterr().out
    assert len((tmp_path / "out" / "batch.jsonl").read_text().splitlines()) == 3


def batch_args(src, out):
    import argparse
    return argparse.Namespace(model=str(src), out=str(out), target="h200", max_steps=0, timeout=60.0, redo=False,
                              workers=None, scheduler=None, retries=1, hang=None, chroma=None)


class _OtherHosts:
    """An engine whose 'workers' are two other hosts, each with its own memory folder."""
    def __init__(self, homes):
        self.homes = homes

    def run_everywhere(self, fn, *args):
        out = {}
        for i, home in enumerate(self.homes):
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("MTMC_HOME", str(home))
                out[f"tcp://host{i}:1"] = fn(*args)
        return out


def test_histories_written_on_other_hosts_are_merged_into_this_log_once(tmp_path, monkeypatch):
    def no_index(path):
        raise MemoryUnavailable("no index in this test")
    monkeypatch.setattr("mtmc.memory.store.shared_index", no_index)
    here, a, b = (synthetic_record("softmax", "softmax", {"M": 64 * i, "N": 128}) for i in (1, 2, 3))
    Store().add(here)
    Store(tmp_path / "h0" / "memory").add(a)
    for rec in (a, b, here):   # host 1 has a copy of a and of ours too
        Store(tmp_path / "h1" / "memory").add(rec)
    hosts = _OtherHosts([tmp_path / "h0", tmp_path / "h1"])
    assert shared.merge_from_workers(hosts) == 2
    assert shared.merge_from_workers(hosts) == 0
    assert sorted(Store().log.records()) == sorted([here.id, a.id, b.id])


def test_the_status_tab_shows_the_configured_cluster_or_why_not(monkeypatch):
    from distributed import LocalCluster
    from mtmc.tools.cluster import SCHEDULER_ENV, cluster_status
    from mtmc.ui.settings import Settings, status_markdown
    monkeypatch.delenv(SCHEDULER_ENV, raising=False)
    assert cluster_status() is None
    assert "Cluster: none configured" in status_markdown(Settings(), {})
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc:
        monkeypatch.setenv(SCHEDULER_ENV, lc.scheduler_address)
        text = status_markdown(Settings(), {})
        assert f"Dask: {lc.scheduler_address}, 2 worker(s), CPU only" in text
    # nothing listens there any more: a line that says so, quickly, never an exception
    start = time.monotonic()
    line = cluster_status(timeout_s=1.0)
    assert "cannot be reached" in line and time.monotonic() - start < 20
