"""Uploaded code runs in an OS-level sandbox (tools.isolation, bubblewrap): a hostile module, at
import, in __init__, in get_inputs or in forward, can neither write outside its scratch, nor read
the server's files, nor reach a listener on 127.0.0.1, nor leave a process running, nor signal
the server; and a host without the sandbox refuses uploads unless the user allows them."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mtmc.agents.module_flow import Rejected, capture_in_child
from mtmc.tools import isolation

PHASES = ("import", "init", "get_inputs", "forward")

ATTACK = '''
import os, signal, subprocess, _socket


def attack():
    out = []
    for target in {writes!r}:
        try:
            with open(target, "w") as f:
                f.write("pwned")
            out.append("wrote " + target)
        except OSError as e:
            out.append("nowrite " + type(e).__name__)
    for secret in {reads!r}:
        try:
            out.append("READ " + open(secret).read())
        except OSError as e:
            out.append("noread " + type(e).__name__)
    try:
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect(("127.0.0.1", {port}))
        out.append("CONNECTED")
    except OSError as e:
        out.append("noconnect " + type(e).__name__)
    try:
        subprocess.Popen(["sleep", "{marker}"], start_new_session=True)
        out.append("spawned")
    except OSError:
        out.append("nospawn")
    try:
        os.kill({pid}, signal.SIGUSR1)
        out.append("SIGNALLED")
    except OSError as e:
        out.append("nosignal " + type(e).__name__)
    return "; ".join(out)


def report(where):
    raise RuntimeError("REPORT from " + where + ": " + attack())

'''

MODULE = '''import torch
import torch.nn as nn
{attack}
{at_import}

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        {at_init}

    def forward(self, x):
        {at_forward}
        return x.relu()


def get_inputs():
    {at_get_inputs}
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
'''


@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 that records every connection it accepts."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


@pytest.fixture
def signals():
    got = []
    previous = signal.signal(signal.SIGUSR1, lambda *a: got.append(a[0]))
    yield got
    signal.signal(signal.SIGUSR1, previous)


def _running(marker: str) -> bool:
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    return True
        except OSError:
            continue
    return False


def test_isolation_is_on_here():
    """CI installs bubblewrap (.ci/run): every other test in this file relies on it."""
    st = isolation.status()
    assert st.ok, st.detail
    assert "PID" in st.detail and "network" in st.detail


@pytest.mark.parametrize("phase", PHASES)
def test_a_hostile_module_is_contained(phase, tmp_path, listener, signals, monkeypatch):
    port, accepted = listener
    home = Path(os.environ["MTMC_HOME"])            # the server's data (conftest: a fresh one per test)
    home.mkdir(parents=True, exist_ok=True)
    memory_db = home / "memory.jsonl"
    memory_db.write_text("secret-memory")
    settings = home / "settings.json"
    settings.write_text('{"llm_api_key": "sk-secret-key"}')
    user_home = Path.home() / f".mtmc-isolation-test-{os.getpid()}"
    user_home.write_text("secret-home")
    marker = f"{3000 + os.getpid() % 1000}.{int(time.time() * 1000) % 100000}"
    host_targets = [str(tmp_path / "pwned"), str(Path.home() / f"pwned-{os.getpid()}"), str(home / "pwned"),
                    str(Path(__file__).parent / f"pwned-{os.getpid()}")]
    hooks = {f"at_{p}": "pass" for p in PHASES}
    hooks[f"at_{phase}"] = f"report({phase!r})"
    source = MODULE.format(attack=ATTACK.format(writes=host_targets, reads=[str(memory_db), str(settings),
                                                                             str(user_home)],
                                                port=port, marker=marker, pid=os.getpid()), **hooks)
    module = tmp_path / f"hostile_{phase}.py"
    module.write_text(source)
    try:
        with pytest.raises(Rejected) as refused:
            capture_in_child(str(module), timeout_s=120)
        message = str(refused.value)
        assert f"REPORT from {phase}" in message, message     # the hostile code did run
        assert "READ" not in message and "secret" not in message, message
        assert "CONNECTED" not in message and not accepted
        assert "SIGNALLED" not in message and not signals
        assert not any(os.path.exists(t) for t in host_targets)
        time.sleep(0.5)
        assert not _running(marker), "a process the module started outlived the run"
    finally:
        user_home.unlink()
        for t in host_targets:
            if os.path.exists(t):
                os.unlink(t)


def test_an_honest_module_runs_inside(tmp_path):
    module = tmp_path / "honest.py"
    module.write_text(MODULE.format(attack="", at_import="", **{f"at_{p}": "pass" for p in PHASES[1:]}))
    captured = capture_in_child(str(module), timeout_s=120)
    assert captured["inputs"] == [{"kind": "tensor", "shape": [4, 8], "dtype": "float32"}]


@pytest.mark.skipif(os.getuid() != 0, reason="the sandbox drops to nobody only when started as root")
def test_code_in_a_private_checkout_stays_importable_after_the_drop(tmp_path, monkeypatch):
    """A clean clone made by `mktemp -d` is mode 0700: a worker importing lazily after it dropped to
    nobody once got "cannot import name 'target_compile'" (every draft failed at compile)."""
    checkout = tmp_path / "checkout"
    (checkout / "lazyprobe").mkdir(parents=True)
    (checkout / "lazyprobe" / "__init__.py").write_text("VALUE = 41\n")
    checkout.chmod(0o700)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")])))
    module = tmp_path / "lazy.py"
    module.write_text(MODULE.format(attack="", at_import="import lazyprobe", **{f"at_{p}": "pass" for p in PHASES[1:]}))
    captured = capture_in_child(str(module), timeout_s=120)
    assert captured["inputs"] == [{"kind": "tensor", "shape": [4, 8], "dtype": "float32"}]


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtmc.commands.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_without_isolation_uploads_are_refused_unless_allowed(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(MODULE.format(attack="", at_import="", **{f"at_{p}": "pass" for p in PHASES[1:]}))
    broken = {isolation.BWRAP_ENV: "/bin/false"}                 # a sandbox that cannot start
    refused = _cli(["optimize", str(module), "--plan-only"], broken)
    assert refused.returncode == 2
    assert "isolation: OFF" in refused.stderr
    assert "not run without isolation" in refused.stdout + refused.stderr
    allowed = _cli(["optimize", str(module), "--plan-only"], {**broken, isolation.ALLOW_ENV: "1"})
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "uploads run anyway" in allowed.stderr and "1 fusion group(s)" in allowed.stdout


def test_the_seccomp_filter_refuses_what_a_job_never_needs(tmp_path):
    if isolation.seccomp_program() is None:
        pytest.skip("no seccomp table for this architecture")
    module = tmp_path / "escape.py"
    escape = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "rc = libc.unshare(0x10000000)\n"                   # CLONE_NEWUSER
              "raise RuntimeError(f'UNSHARE {rc} errno {ctypes.get_errno()}')\n")
    module.write_text(escape)
    with pytest.raises(Rejected) as refused:
        capture_in_child(str(module), timeout_s=60)
    assert "UNSHARE -1 errno 1" in str(refused.value)           # EPERM from the filter


def test_a_sandbox_in_the_host_pid_namespace_is_cleaned_up_by_its_uid():
    """The guard's GPU sessions share the host's PID namespace (CUDA IPC needs it): they run as
    a uid of their own, and ending that uid ends what a module started."""
    from mtmc.kernels.task import Session
    uid = isolation.fresh_uid()
    if uid is None:
        pytest.skip("distinct sandbox uids need the server to run as root")
    marker = f"{4000 + os.getpid() % 1000}.{int(time.time() * 1000) % 100000}"
    leave = (f"import subprocess, os\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
             "raise RuntimeError(f'uid {os.getuid()}')\n")
    job = {"kind": "check", "spec": {"family": "elementwise", "op": "chain", "dims": {"M": 4, "N": 4},
                                     "dtype": "float32", "params": {"chain": [{"op": "relu"}]}},
           "source": leave, "device": "cpu"}
    with Session(interpret=True, name="test", confine=isolation.Confinement(share_pid=True, uid=uid)) as s:
        r = s.call(job, 60)
    assert r["status"] == "error" and r["message"] == f"uid {uid}"
    time.sleep(0.3)
    assert _running(marker)              # it left its process group: the group kill missed it
    isolation.kill_uid(uid)
    time.sleep(0.3)
    assert not _running(marker)


def test_a_folder_is_shown_in_place_only_where_its_file_would_bring_it_anyway(tmp_path, monkeypatch):
    """The guard's spare candidate session sees the candidates' whole folder; that must show it no
    more than a fresh session given one file there: the folder is bound only when we drop to the
    sandbox user and anyone may read it and the file (else the file alone, or a staged copy)."""
    from mtmc.tools import isolation
    shown, private = tmp_path / "shown", tmp_path / "private"
    for d, mode in ((shown, 0o755), (private, 0o700)):
        d.mkdir()
        (d / "m.py").write_text("x = 1\n")
        d.chmod(mode)
    monkeypatch.setattr(isolation, "_drops_user", lambda: True)
    assert isolation.readable_in_place(shown / "m.py") and isolation.readable_in_place(shown)
    assert not isolation.readable_in_place(private / "m.py") and not isolation.readable_in_place(shown / "no.py")
    monkeypatch.setattr(isolation, "_drops_user", lambda: False)   # a child keeping our uid: the file alone
    assert not isolation.readable_in_place(shown / "m.py")
