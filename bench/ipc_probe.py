"""Which sandbox setting makes the driver refuse CUDA IPC exports (the guard's file crossing).

On the GPU machine the guard's two sessions (bubblewrap, dropped from root to a uid of their own,
host PID namespace) cannot export CUDA IPC handles, so tensors cross as files: the module check
is slow and its inputs are cut.  This probe exports a CUDA tensor from a child started each way
below and, where that works, opens it in a second child started the same way:

    python -m bench.ipc_probe [--out FILE.json] [--only WORDS ...]

One line per way: export ok / the error, import ok / the error.  GPU only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mtmc.tools import isolation

_SIZE = 1 << 20


def _child(role: str) -> None:
    """Inside: become the sandbox user (where bubblewrap says so), then export or import."""
    isolation.drop_privileges()
    if os.environ.get("PROBE_DUMPABLE"):
        import ctypes
        ctypes.CDLL(None).prctl(4, int(os.environ["PROBE_DUMPABLE"]), 0, 0, 0)   # PR_SET_DUMPABLE
    import torch   # before a plain setuid: the installation may be unreadable to that uid

    if os.environ.get("PROBE_SETUID"):
        uid = int(os.environ["PROBE_SETUID"])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    from mtmc.tools.guard import exchange
    out = {"uid": os.getuid(), "pid": os.getpid()}
    try:
        if role == "export":
            t = torch.arange(_SIZE, device="cuda", dtype=torch.float32)
            out["handle"] = exchange._ipc_handles([t])
            print(json.dumps(out), flush=True)
            sys.stdin.readline()          # keep the tensor alive until the importer is done
            return
        handle = sys.stdin.readline().strip()
        got = exchange._CudaOnly(__import__("io").BytesIO(__import__("base64").b64decode(handle))).load()[0]
        out["sum_ok"] = bool(got.sum().item() == float(_SIZE * (_SIZE - 1) // 2))
    except Exception as e:   # the finding itself
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(json.dumps(out), flush=True)


def _argv(role: str, way: dict, scratch: Path, shm: Path, uid: int | None) -> tuple[list[str], int | None]:
    argv = [sys.executable, "-m", "bench.ipc_probe", "--child", role]
    if not way.get("bwrap"):
        return argv, None
    confine = isolation.Confinement(gpu=True, shm=str(shm), share_pid=True, uid=uid)
    for path in (scratch, shm):
        isolation.give_to_sandbox(path, confine.user)
    fd = None if way.get("no_seccomp") else isolation.seccomp_fd(scratch)
    if "bare" in way:   # bubblewrap with nothing but the namespaces named: the host's files as they are
        bare = [isolation.bwrap_path(), "--bind", "/", "/", "--dev-bind", "/dev", "/dev", *way["bare"]]
        return bare + ["--", *argv], None
    cmd = isolation.command(argv, scratch, confine, fd)
    if way.get("no_drop"):
        i = cmd.index(isolation.DROP_ENV) - 1
        del cmd[i:i + 3]
    if way.get("host_shm"):
        i = cmd.index("/dev/shm") - 2
        del cmd[i:i + 3]
    for cut in way.get("drop_flags", ()):
        cut = cut.split()
        i = next(i for i in range(len(cmd)) if cmd[i:i + len(cut)] == cut)
        del cmd[i:i + len(cut)]
    if way.get("extra"):   # binds added last, over the sandbox's own
        at = len(cmd) - len(argv) - 1
        cmd[at:at] = way["extra"]
    if way.get("dev_bind"):
        i = cmd.index("--dev")
        cmd[i:i + 2] = ["--dev-bind", "/dev"]
        cmd.insert(i + 2, "/dev")
    return cmd, fd


def _start(role: str, way: dict, scratch: Path, shm: Path, uid: int | None) -> subprocess.Popen:
    cmd, fd = _argv(role, way, scratch, shm, uid)
    env = {**os.environ, **way.get("env", {}), "PYTHONPATH": os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p)}
    try:
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=scratch, pass_fds=(fd,) if fd is not None else ())
    finally:
        if fd is not None:
            os.close(fd)


def _line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    if not line:
        return {"error": "no answer: " + proc.stderr.read()[-400:]}
    return json.loads(line)


def try_way(name: str, way: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="ipc-probe-") as tmp:
        tmp = Path(tmp)
        os.chmod(tmp, 0o755)
        shm = tmp / "shm"
        shm.mkdir()
        scratches = [tmp / "a", tmp / "b"]
        for s in scratches:
            s.mkdir()
        uid = isolation.fresh_uid() if way.get("bwrap") else None
        exporter = _start("export", way, scratches[0], shm, uid)
        try:
            exported = _line(exporter)
            result = {"way": name, "export": "ok" if "handle" in exported else exported.get("error"),
                      "uid": exported.get("uid")}
            if "handle" in exported:
                importer = _start("import", way, scratches[1], shm, uid)
                out, err = importer.communicate(exported["handle"] + "\n", timeout=120)
                got = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err[-400:]}
                result["import"] = "ok" if got.get("sum_ok") else got.get("error", "wrong values")
        finally:
            exporter.kill()
            exporter.wait()
            isolation.kill_uid(uid)
    return result


def ways() -> dict:
    root = os.geteuid() == 0
    out = {"plain": {}, "plain, not dumpable": {"env": {"PROBE_DUMPABLE": "0"}}}
    if root:
        out["plain, setuid to 4242"] = {"env": {"PROBE_SETUID": "4242"}}
        out["plain, setuid, dumpable again"] = {"env": {"PROBE_SETUID": "4242", "PROBE_DUMPABLE": "1"}}
    if isolation.status().ok:
        out.update({
            "bare bubblewrap": {"bwrap": True, "bare": []},
            "bare bubblewrap, network namespace": {"bwrap": True, "bare": ["--unshare-net"]},
            "bare bubblewrap, IPC namespace": {"bwrap": True, "bare": ["--unshare-ipc"]},
            "bare bubblewrap, new /proc": {"bwrap": True, "bare": ["--proc", "/proc"]},
            "bare bubblewrap, tmpfs /run": {"bwrap": True, "bare": ["--tmpfs", "/run"]},
            "bare bubblewrap, new session": {"bwrap": True, "bare": ["--new-session"]},
            "bare bubblewrap, no capabilities": {"bwrap": True, "bare": ["--cap-drop", "ALL"]},
            "sandbox, no network namespace": {"bwrap": True, "drop_flags": ["--unshare-net"]},
            "sandbox, no UTS/cgroup namespace": {"bwrap": True, "drop_flags": ["--unshare-uts", "--unshare-cgroup-try",
                                                                                 "--hostname mtmc-sandbox"]},
            "sandbox, no new session": {"bwrap": True, "drop_flags": ["--new-session"]},
            "sandbox, host /run": {"bwrap": True, "drop_flags": ["--perms 0755 --tmpfs /run"]},
            "sandbox, host /tmp": {"bwrap": True, "drop_flags": ["--perms 1777 --tmpfs /tmp"]},
            "sandbox, host /dev/shm": {"bwrap": True, "host_shm": True},
            "sandbox, no drop to a uid (root without capabilities)": {
                "bwrap": True, "no_drop": True},
            "bare bubblewrap, setuid": {"bwrap": True, "bare": [], "env": {"PROBE_SETUID": "4242"}},
        })
        out.update({
            "sandbox as the guard starts it": {"bwrap": True},
            "sandbox, dumpable again": {"bwrap": True, "env": {"PROBE_DUMPABLE": "1"}},
            "sandbox, no IPC namespace": {"bwrap": True, "drop_flags": ["--unshare-ipc"]},
            "sandbox, no seccomp": {"bwrap": True, "no_seccomp": True},
            "sandbox, host /dev": {"bwrap": True, "dev_bind": True},
            "sandbox, host /etc": {"bwrap": True, "extra": ["--ro-bind", "/etc", "/etc"]},
            "sandbox, host /var": {"bwrap": True, "extra": ["--ro-bind-try", "/var", "/var"]},
            "sandbox, host /proc": {"bwrap": True, "extra": ["--bind", "/proc", "/proc"]},
            "sandbox, whole host read-only over it": {"bwrap": True, "extra": ["--ro-bind", "/", "/",
                                                                               "--dev-bind", "/dev", "/dev"]},
            "sandbox, no IPC ns, dumpable, host /dev": {"bwrap": True, "drop_flags": ["--unshare-ipc"],
                                                        "dev_bind": True, "env": {"PROBE_DUMPABLE": "1"}},
        })
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", choices=("export", "import"), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path)
    p.add_argument("--only", nargs="*", help="only the ways whose name contains one of these")
    args = p.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    results = []
    for name, way in ways().items():
        if args.only and not any(s in name for s in args.only):
            continue
        try:
            results.append(try_way(name, way))
        except Exception as e:   # one way failing to start must not hide the others
            results.append({"way": name, "export": f"probe failed: {type(e).__name__}: {e}"})
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
