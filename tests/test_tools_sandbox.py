"""Untrusted candidates in a child process (tools.sandbox + tools.worker)."""
import os
import time

import pytest

from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.task import run_job
from mtmc.tools.sandbox import child_env

SPEC = KernelSpec("elementwise", "chain", {"M": 64, "N": 1000}, "float32", {"chain": [{"op": "relu"}]})


def check_job(source: str, **extra) -> dict:
    return {"kind": "check", "spec": SPEC.to_dict(), "source": source, "device": "cpu", "trials": 1, **extra}


def assert_parent_still_works():
    r = run_job({"kind": "ping"}, timeout_s=30)
    assert r["status"] == "ok" and r["result"]["pid"] != os.getpid()


def test_ping_runs_in_another_process():
    assert_parent_still_works()


def _hang_leaving(marker: str) -> str:
    """Candidate source that starts a process which would outlive it, then hangs."""
    return (f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
            "while True:\n    pass\n")


def _running(marker: str) -> bool:
    """A process whose command line holds `marker` is alive on this host (zombies excepted)."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    with open(f"/proc/{entry}/stat") as st:
                        if st.read().split(")")[-1].split()[0] != "Z":
                            return True
        except (OSError, ValueError):
            continue
    return False


def _eventually_gone(marker: str, wait_s: float = 5.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not _running(marker):
            return True
        time.sleep(0.1)
    return False


def test_hang_times_out_and_the_whole_group_is_killed():
    marker = f"{1000 + os.getpid() % 1000}.{int(time.time()) % 10000}"
    start = time.monotonic()
    r = run_job(check_job(_hang_leaving(marker)), timeout_s=6)
    assert r["status"] == "timed_out" and r["timeout_s"] == 6
    assert 6 <= time.monotonic() - start < 20
    assert _eventually_gone(marker), "the candidate's subprocess outlived the job"
    assert_parent_still_works()


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":   # a zombie is dead, awaiting reaping
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_segfault_is_reported_as_crashed():
    r = run_job(check_job("import ctypes\nctypes.string_at(0)\n"), timeout_s=60)
    assert r["status"] == "crashed" and r["returncode"] == -11
    assert "SIGSEGV" in r["detail"]
    assert "Segmentation fault" in r["stderr_tail"]   # faulthandler's traceback for the debugger
    assert_parent_still_works()


def test_exception_in_candidate_is_an_error_verdict():
    r = run_job(check_job("def helper():\n    raise ValueError('bad candidate')\nhelper()\n"), timeout_s=60)
    assert r["status"] == "error" and r["error_type"] == "ValueError"
    assert r["message"] == "bad candidate" and "helper" in r["traceback"]
    assert_parent_still_works()


def test_unbounded_allocation_hits_the_memory_limit():
    hog = "x = []\nwhile True:\n    x.append(bytearray(64 * 2**20))\n"
    r = run_job(check_job(hog), timeout_s=60, memory_mb=1536)
    assert r["status"] in ("error", "crashed"), r
    if r["status"] == "error":
        assert r["error_type"] == "MemoryError"
    assert_parent_still_works()


def test_secrets_do_not_reach_the_child(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret")
    monkeypatch.setenv("HF_TOKEN", "hf-parent-secret")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:1")
    monkeypatch.setenv("MTMC_PROBE", "visible")
    dump = "import os\nraise RuntimeError(repr(sorted(os.environ.items())))\n"
    r = run_job(check_job(dump), timeout_s=60)
    assert r["status"] == "error"
    seen = r["message"]
    for leaked in ("OPENAI_API_KEY", "sk-parent-secret", "HF_TOKEN", "hf-parent-secret", "HTTPS_PROXY"):
        assert leaked not in seen
    assert "('MTMC_PROBE', 'visible')" in seen       # the scrub keeps what mtmc needs
    env = child_env({"PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "x", "TRITON_CACHE_DIR": "/c", "SHELL": "sh"})
    assert set(env) >= {"PATH", "TRITON_CACHE_DIR", "PYTHONPATH"}
    assert "AWS_SECRET_ACCESS_KEY" not in env and "SHELL" not in env
    # OpenMP in a memory-capped child on a 16-core host failed to start its threads (H200 run)
    assert 1 <= int(env["OMP_NUM_THREADS"]) <= 4
    assert child_env({"PATH": "/bin", "OMP_NUM_THREADS": "2"})["OMP_NUM_THREADS"] == "2"


def test_candidate_prints_do_not_corrupt_the_result():
    noisy = ("import os\nprint('printed by the candidate')\nos.write(1, b'written to fd 1\\n')\n"
             "raise KeyError('done')\n")
    r = run_job(check_job(noisy), timeout_s=60)
    assert r["status"] == "error" and r["error_type"] == "KeyError"
    assert "printed by the candidate" in r["stderr_tail"] and "written to fd 1" in r["stderr_tail"]


@pytest.mark.parametrize("interpret, seen", [(True, "'1'"), (False, "None"), (None, "None")])
def test_interpret_flag_sets_the_child_environment(monkeypatch, interpret, seen):
    monkeypatch.setenv("TRITON_INTERPRET", "1")     # the parent's own setting must not leak through
    probe = "import os\nraise RuntimeError(repr(os.environ.get('TRITON_INTERPRET')))\n"
    # device "cuda": the worker leaves the sandbox's setting alone (the probe fails before any
    # CUDA call, so no GPU is needed); None means "by the job": off for kernels on a GPU.
    r = run_job(check_job(probe, device="cuda"), timeout_s=60, interpret=interpret)
    assert r["status"] == "error" and r["message"] == seen


def _render(spec: KernelSpec):
    fam = family_of(spec)
    config = fam.default_config(spec, None)
    return fam.render(spec, config), fam.check_dims(spec, config)


def test_verify_compiles_then_checks_a_correct_kernel():
    source, dims = _render(SPEC)
    job = {"kind": "verify", "spec": SPEC.to_dict(), "source": source, "dims": dims, "device": "cpu",
           "trials": 1, "target": "h200"}
    r = run_job(job, timeout_s=120, memory_mb=4096)
    assert r["status"] == "ok", r
    res = r["result"]
    assert res["passed"] is True and res["failed_at"] is None
    assert res["compile"]["ok"] and res["compile"]["kernels"][0]["regs"] > 0
    assert res["check"]["ok"] and res["check"]["dims"] == dims
    assert "time" not in res       # no GPU here


def test_verify_stops_at_a_wrong_result():
    source, dims = _render(SPEC)
    wrong = source.replace("tl.maximum(x, 0.0)", "tl.minimum(x, 0.0)")
    assert wrong != source
    job = {"kind": "verify", "spec": SPEC.to_dict(), "source": wrong, "dims": dims, "device": "cpu",
           "trials": 1, "target": "h200"}
    r = run_job(job, timeout_s=120)
    assert r["status"] == "ok"
    res = r["result"]
    assert res["passed"] is False and res["failed_at"] == "check"
    assert res["compile"]["ok"] and not res["check"]["ok"]


def test_unknown_job_kind_is_an_error():
    r = run_job({"kind": "launch_missiles"}, timeout_s=30)
    assert r["status"] == "error" and "unknown job kind" in r["message"]


@pytest.mark.gpu
def test_time_job_measures_on_the_gpu():
    source, _ = _render(SPEC.with_dims(M=4096, N=4096))
    job = {"kind": "time", "spec": SPEC.with_dims(M=4096, N=4096).to_dict(), "source": source, "baselines": True}
    r = run_job(job, timeout_s=300)
    assert r["status"] == "ok", r
    t = r["result"]
    assert t["measured"] is True and t["ours_ms"] > 0 and t["eager_ms"] > 0
    assert t["compiled_ms"] is not None or t["compiled_note"].startswith("compile failed")
    assert t["achieved_gbs"] > 0


@pytest.mark.gpu
def test_illegal_memory_access_stays_in_the_child():
    wild = ("import triton\nimport triton.language as tl\n\n@triton.jit\ndef wild(p):\n"
            "    tl.store(p + (1 << 40), 1.0)\n\ndef launch(x, out):\n    wild[(1,)](out)\n")
    r = run_job(check_job(wild, device="cuda"), timeout_s=120)
    assert r["status"] in ("error", "crashed"), r
    assert "illegal" in (r.get("message", "") + r.get("detail", "")).lower()
    import torch
    torch.ones(4, device="cuda").sum().item()          # this process's CUDA context is intact
    assert_parent_still_works()


def test_session_serves_many_jobs_in_one_process_and_ends_with_its_group():
    from mtmc.kernels.task import Session
    with Session(interpret=True, name="test") as s:
        first, second = s.call({"kind": "ping"}, 30), s.call({"kind": "ping"}, 30)
        assert first["status"] == second["status"] == "ok"
        assert first["result"]["pid"] == second["result"]["pid"]
        noisy = s.call(check_job("print('only in this call')\nraise KeyError('x')\n"), 60)
        assert noisy["status"] == "error" and "only in this call" in noisy["stderr_tail"]
        assert "only in this call" not in s.call({"kind": "ping"}, 30)["stderr_tail"]
        worker = s.proc.pid
        marker = f"{2000 + os.getpid() % 1000}.{int(time.time()) % 10000}"
        r = s.call(check_job(_hang_leaving(marker)), 5)
        assert r["status"] == "timed_out" and not s.alive
        assert _gone(worker) and _eventually_gone(marker)
        assert s.call({"kind": "ping"}, 30)["status"] == "timed_out"   # dead sessions say so
    assert not s.scratch.exists()


def test_session_crash_is_reported_and_close_kills_the_worker():
    from mtmc.kernels.task import Session
    s = Session(name="test")
    r = s.call(check_job("import ctypes\nctypes.string_at(0)\n"), 60)
    assert r["status"] == "crashed" and "SIGSEGV" in r["detail"] and not s.alive
    s2 = Session(name="test")
    assert s2.call({"kind": "ping"}, 30)["status"] == "ok"
    pid = s2.proc.pid
    s2.close()
    assert _gone(pid)


def test_a_session_outlives_the_thread_that_started_it():
    """bubblewrap's --die-with-parent follows the starting *thread*: a session made in a worker
    thread (the module flow's groups run in threads) was killed when that thread ended."""
    import threading

    from mtmc.tools.worker import Session
    made = []

    def start():
        made.append(Session(name="test"))
        assert made[0].call({"kind": "ping"}, 30)["status"] == "ok"   # bubblewrap is set up by now
    t = threading.Thread(target=start)
    t.start()
    t.join()
    with made[0] as s:
        time.sleep(1.0)
        assert s.call({"kind": "ping"}, 30)["status"] == "ok" and s.alive


def test_a_warm_session_has_torch_loaded_before_its_first_job():
    """The guard starts its next candidate session ahead of the check; warm, its worker imports
    torch and Triton (and starts CUDA on a GPU) while it waits, so the check does not wait for that."""
    from mtmc.tools.worker import Session
    with Session(interpret=True, name="test", warm="cpu") as warm, Session(interpret=True, name="test") as cold:
        assert warm.call({"kind": "ping"}, 60)["result"]["torch_loaded"] is True
        assert cold.call({"kind": "ping"}, 60)["result"]["torch_loaded"] is False
