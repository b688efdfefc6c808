"""Run untrusted verifier work (candidate kernels, uploaded modules) in a child process.

A candidate can hang, crash the interpreter, exhaust memory or poison the CUDA context for
good, so each job runs in `python -m ENTRY` (a worker entry module: tools.worker, or a package's
own that serves its jobs with tools.worker's loop) in its own process group, with a scrubbed
environment, a fresh scratch directory and resource limits.  The job goes in as JSON on stdin,
one JSON result comes back on stdout; whatever happens, the caller gets a dict with a "status"
of "ok", "error" (the candidate raised: a verdict), "timed_out" or "crashed".
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mtmc.tools import isolation
from mtmc.tools.isolation import Confinement

_KEEP = {"PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "TMPDIR", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
         "OMP_NUM_THREADS"}
_KEEP_PREFIXES = ("TRITON_", "CUDA_", "MTMC_", "TORCHINDUCTOR_")
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|PROXY", re.I)
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
WARM_ENV = "MTMC_WARM"   # "cpu" or "cuda": what a session's worker gets ready before its first job
_STDERR_TAIL_LINES = 40


def child_env(base: dict | None = None, interpret: bool | None = None) -> dict:
    """The environment a job sees: only what Python, CUDA, Triton and mtmc need, never secrets."""
    base = dict(os.environ if base is None else base)
    env = {k: v for k, v in base.items()
           if (k in _KEEP or k.startswith(_KEEP_PREFIXES)) and not _SECRET.search(k)}
    # The worker must import this package even when it is not installed.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    # A memory-capped child on a many-core host cannot reserve a thread (stack, malloc arena)
    # per core: OpenMP then aborts at start ("libgomp: Thread creation failed").
    env.setdefault("OMP_NUM_THREADS", str(min(4, os.cpu_count() or 1)))
    if interpret is True:
        env["TRITON_INTERPRET"] = "1"
    elif interpret is False:
        env.pop("TRITON_INTERPRET", None)
    return env


def uses_gpu(job: dict) -> bool:
    return job.get("kind") == "time" or job.get("device") == "cuda"


def default_interpret(job: dict) -> bool | None:
    """Kernels on CPU tensors need the interpreter; on a GPU they must not use it; compiling
    for a target needs it off, which the worker ensures itself."""
    if job.get("kind") in ("check", "verify"):
        return job.get("device", "cpu") == "cpu"
    return False if job.get("kind") == "time" else None


def _limits(timeout_s: float, memory_mb: int | None):
    """preexec function setting the child's rlimits (run after fork, before exec)."""
    # CPU time is a backstop for a parent that died; threads burn CPU faster than wall time,
    # so it allows twice the wall timeout plus slack.
    cpu = int(math.ceil(2 * timeout_s)) + 5

    def lower(kind: int, soft: int, hard: int) -> None:
        # a child of a limited process (a nested compile) cannot raise what it inherited
        _, inherited = resource.getrlimit(kind)
        if inherited != resource.RLIM_INFINITY:
            soft, hard = min(soft, inherited), min(hard, inherited)
        resource.setrlimit(kind, (soft, hard))

    def apply():
        lower(resource.RLIMIT_CPU, cpu, cpu + 5)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_mb is not None:
            mem = int(memory_mb) * 2**20
            lower(resource.RLIMIT_AS, mem, mem)
    return apply


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is already gone
        pass


def _parse_result(stdout: str) -> dict | None:
    """The worker's result: the last non-empty stdout line, if it is a JSON object."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        result = json.loads(lines[-1])
    except ValueError:
        return None
    return result if isinstance(result, dict) and "status" in result else None


def _status(returncode: int | None) -> int | None:
    """The worker's exit status as Popen would give it without bubblewrap in between: bubblewrap
    exits with 128 + N when the sandboxed worker died of signal N."""
    if returncode is not None and 128 < returncode < 128 + 65:
        return -(returncode - 128)
    return returncode


def _exit_detail(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _communicate(proc: subprocess.Popen, job: dict, timeout_s: float) -> bytes | None:
    """Send the job, wait for the worker; None on timeout. The whole process group is killed
    either way, so nothing the candidate started outlives the job."""
    try:
        stdout, _ = proc.communicate(json.dumps(job).encode(), timeout=timeout_s)
        return stdout
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        # bounded: a process that left the group could still hold the pipe open
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)
        return None
    finally:
        _kill_group(proc)


def _verdict(stdout: bytes | None, returncode: int | None, timeout_s: float, tail: str) -> dict:
    if stdout is None:
        return {"status": "timed_out", "timeout_s": timeout_s,
                "detail": f"no result within {timeout_s:g} s; the job's process group was killed"}
    result = _parse_result(stdout.decode("utf-8", "replace"))
    if returncode != 0 or result is None:
        why = _exit_detail(returncode) if returncode != 0 else "printed no JSON result"
        return {"status": "crashed", "returncode": returncode,
                "detail": f"worker {why}" + (f"\n{tail}" if tail else "")}
    return result


def _spawn(entry: str, argv_tail: list[str], scratch: Path, stderr, env: dict, limits, confine: Confinement | None,
           untrusted: bool) -> subprocess.Popen:
    """Start `python -m ENTRY ARGS` in its own process group and scratch directory, inside
    bubblewrap (tools.isolation) wherever it works: the one place children are started.
    untrusted: the child runs uploaded code, which is refused when it cannot be isolated."""
    argv = [sys.executable, "-m", entry, *argv_tail]
    fd = None
    if isolation.require(untrusted):
        confine = confine or isolation.Confinement()
        for path in [scratch, *confine.rw, *([confine.shm] if confine.shm else [])]:
            isolation.give_to_sandbox(path, confine.user)
        fd = isolation.seccomp_fd(scratch)
        argv = isolation.command(argv, scratch, confine, fd)
    try:
        # bubblewrap's --die-with-parent follows the *thread* that started it (PR_SET_PDEATHSIG):
        # start every child from one thread that lives as long as this process
        return _SPAWNER.submit(subprocess.Popen, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=stderr, cwd=scratch, env=env, start_new_session=True, preexec_fn=limits,
                                 pass_fds=(fd,) if fd is not None else ()).result()
    finally:
        if fd is not None:
            os.close(fd)


# its one thread starts on the first child and stays for the life of the process
_SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="mtmc-spawner")


def run_job(job: dict, timeout_s: float, memory_mb: int | None = None, interpret: bool | None = None,
            confine: Confinement | None = None, untrusted: bool = True, *, entry: str) -> dict:
    """Run one job in a sandboxed child process running `python -m ENTRY` (a worker entry module:
    see tools.worker for its jobs; tools.worker.run_job names it).

    memory_mb caps the address space, and only for jobs that use no GPU (CUDA reserves far more
    virtual memory than it uses).  interpret: True sets TRITON_INTERPRET=1, False unsets it,
    None picks by the job (see default_interpret).  Every result has "status", "wall_s" and
    "stderr_tail" (the child's last stderr lines: warnings, prints, a segfault's traceback).
    confine: what the child may see beyond the basics (tools.isolation); a job on the GPU gets
    the GPU.  untrusted=False (code we generated) runs even where isolation is unavailable."""
    if interpret is None:
        interpret = default_interpret(job)
    confine = confine or Confinement()
    confine.gpu = confine.gpu or uses_gpu(job)
    scratch = Path(tempfile.mkdtemp(prefix="mtmc-job-"))
    stderr_path = scratch / "stderr.log"
    start = time.monotonic()
    try:
        # stderr goes to a file: a chatty candidate cannot fill a pipe or the parent's memory.
        with open(stderr_path, "wb") as err:
            proc = _spawn(entry, [], scratch, err, child_env(interpret=interpret),
                          _limits(timeout_s, None if uses_gpu(job) else memory_mb), confine, untrusted)
            stdout = _communicate(proc, job, timeout_s)
        tail = _tail_from(stderr_path, 0)
        result = _verdict(stdout, _status(proc.returncode), timeout_s, tail)
        result.update(wall_s=time.monotonic() - start, stderr_tail=tail)
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


SESSION_CPU_S = 24 * 3600   # a session's CPU-time backstop; each call has its own wall timeout


class Session:
    """A sandboxed worker that serves many jobs (`python -m ENTRY --serve`), so torch,
    Triton and CUDA start once, and state (a reference run's tensors) can stay in the child
    between jobs.  `call` returns what run_job returns; after "timed_out" or "crashed" the
    session is dead (its whole process group killed) and every later call says so.  Close it
    (or use it as a context manager): the process group is killed and its scratch removed; the
    same happens when the parent exits."""

    def __init__(self, interpret: bool | None = False, memory_mb: int | None = None, name: str = "worker",
                 confine: Confinement | None = None, untrusted: bool = True, *, entry: str, warm: str | None = None):
        self.name = name
        self.scratch = Path(tempfile.mkdtemp(prefix=f"mtmc-{name}-"))
        self._stderr_path = self.scratch / "stderr.log"
        self._err = open(self._stderr_path, "wb")
        env = child_env(interpret=interpret)
        if warm:   # the worker imports torch (and starts CUDA) before its first job: see tools.worker.serve
            env[WARM_ENV] = warm
        try:
            self.proc = _spawn(entry, ["--serve"], self.scratch, self._err, env,
                               _limits(SESSION_CPU_S, memory_mb), confine, untrusted)
        except BaseException:
            self._err.close()
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        self._buffer = b""
        self.dead: dict | None = None
        self.calls = 0
        # a parent that exits (or forgets the session) must not leave the worker behind
        self._finalizer = weakref.finalize(self, _end_session, self.proc, self._err, self.scratch)

    @property
    def alive(self) -> bool:
        return self.dead is None and self.proc.poll() is None

    def call(self, job: dict, timeout_s: float) -> dict:
        if self.dead is not None:
            return {**self.dead, "detail": f"the {self.name} session already ended: {self.dead.get('detail', '')}"}
        start = time.monotonic()
        offset = self._stderr_path.stat().st_size
        self.calls += 1
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
            line = self._read_line(timeout_s)
        except (BrokenPipeError, OSError):
            line = b""
        if line is None:
            result = {"status": "timed_out", "timeout_s": timeout_s,
                      "detail": f"no result within {timeout_s:g} s; the session's process group was killed"}
        elif not line:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            code = _status(self.proc.returncode)
            result = {"status": "crashed", "returncode": code, "detail": f"worker {_exit_detail(code or 0)}"}
        else:
            result = _parse_result(line.decode("utf-8", "replace")) or {
                "status": "crashed", "returncode": None, "detail": "the worker printed something that is no result"}
        tail = _tail_from(self._stderr_path, offset)
        if result["status"] in ("timed_out", "crashed"):
            if result["status"] == "crashed" and tail:
                result["detail"] += f"\n{tail}"
            self.dead = {k: result[k] for k in ("status", "detail")}
            self.close()
        result.update(wall_s=time.monotonic() - start, stderr_tail=tail)
        return result

    def _read_line(self, timeout_s: float) -> bytes | None:
        """The next line of the worker's stdout; b"" at EOF, None after timeout_s."""
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def stderr_tail(self) -> str:
        """The last lines the worker wrote to stderr over the whole session."""
        return _tail_from(self._stderr_path, 0)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _end_session(proc: subprocess.Popen, err, scratch: Path) -> None:
    _kill_group(proc)
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)
    for stream in (proc.stdin, proc.stdout, err):
        with contextlib.suppress(Exception):
            stream.close()
    shutil.rmtree(scratch, ignore_errors=True)


def _tail_from(path: Path, offset: int, max_bytes: int = 64 * 1024) -> str:
    """The last lines written to a stderr file since `offset` (a file that may be huge)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(max(offset, size - max_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-_STDERR_TAIL_LINES:])
