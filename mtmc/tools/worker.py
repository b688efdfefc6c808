"""The verifier's child process: `python -m mtmc.tools.worker` reads one JSON job on stdin and
prints one JSON result on stdout; with `--serve` it answers one job per line until stdin closes
(a tools.sandbox.Session).  tools.sandbox starts it (`run_job` and `Session` here name it); never
run candidates elsewhere.  A package with jobs of its own serves them with this loop from an entry
module of its own (mtmc.module.worker: capture), handing `main` its handlers and these.

Jobs on a candidate kernel carry "task" (plain data built by the caller, kernels.task: dims,
dtype, inputs, output, reference source, work) and "source": the candidate:
  {"kind": "compile", "dims": {...}?, "target": "h200"?, "profile": {...}?}
                                                                -> {"result": ResourceReport dict}
  {"kind": "check", "dims": {...}?, "device": "cpu"|"cuda", "trials": 2}
                                                                -> {"result": CheckResult dict}
  {"kind": "time", "baselines": true}                           -> {"result": timing dict}
  {"kind": "verify", "dims": check dims?, "device": ..., "trials": ..., "target": name or None,
   "compile_dims": {...}?, "time_task": {...}?, "baselines": true}
        -> {"result": {"passed": bool, "failed_at": part or None, "compile": ..., "check": ...,
                       "time": ...}}  (compile only with a target, time only on a GPU;
           stops at the first part that fails)
  {"kind": "ping"}                                              -> {"result": {"pid", "python"}}
Missing dims mean the task's, except in verify: compile_dims default to the (small) check dims,
which families choose to keep the real shape's alignment, so the specialization is the same;
the timing runs at time_task's dims (default: the task's).
Results: {"status": "ok", "kind", "result", "job_s"}; a Python exception anywhere in the job
(the candidate's or ours) is {"status": "error", "kind", "error_type", "message", "traceback"}
plus, for verify, "part" and the parts that finished.
"""
from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import time
import traceback

from mtmc.tools import sandbox
from mtmc.tools.hardware import gpu_available

ENTRY = "mtmc.tools.worker"   # `python -m ENTRY`: this module
COMPILE_TIMEOUT_S = 300.0     # a compile in a fresh child (compile_resources)


class PartError(Exception):
    """An exception in one part of a verify job, carrying the parts that finished."""

    def __init__(self, part: str, done: dict, cause: BaseException):
        super().__init__(str(cause))
        self.part, self.done, self.cause = part, done, cause


@contextlib.contextmanager
def interpreted(on: bool):
    """TRITON_INTERPRET for kernels decorated inside the block (Triton reads it at @jit time)."""
    old = os.environ.get("TRITON_INTERPRET")
    if on:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield
    finally:
        os.environ.pop("TRITON_INTERPRET", None)
        if old is not None:
            os.environ["TRITON_INTERPRET"] = old


def run_job(job: dict, timeout_s: float, **options) -> dict:
    """tools.sandbox.run_job of one of this worker's jobs (the options are run_job's)."""
    return sandbox.run_job(job, timeout_s, entry=ENTRY, **options)


class Session(sandbox.Session):
    """A tools.sandbox.Session of this worker (the options are Session's)."""

    def __init__(self, **options):
        super().__init__(entry=ENTRY, **options)


def compile_resources(source: str, task: dict, dims: dict | None, profile):
    """tools.target_compile.compile_resources in this process, or, where Triton's interpreter has
    spoiled it (tools.triton_state), in a fresh child with the interpreter off; the source's own
    exception is raised here again (as its builtin type when it has one)."""
    import builtins

    from mtmc.tools import target_compile
    from mtmc.tools.triton_state import compile_blocker
    if compile_blocker() is None:
        return target_compile.compile_resources(source, task, dims, profile)
    job = {"kind": "compile", "task": task, "source": source, "dims": dict(dims or task["dims"]),
           "profile": profile.to_dict()}
    r = run_job(job, COMPILE_TIMEOUT_S, interpret=False, untrusted=False)
    if r["status"] == "ok":
        return target_compile.report_from_dict(r["result"])
    if r["status"] == "error":
        kind = getattr(builtins, r.get("error_type") or "", None)
        kind = kind if isinstance(kind, type) and issubclass(kind, Exception) else RuntimeError
        raise kind(r.get("message", ""))
    raise RuntimeError(f"compiling in a fresh process {r['status']}: {r.get('detail', '')[:500]}")


def do_compile(job: dict, dims: dict | None = None) -> dict:
    from mtmc.tools.hardware import HardwareProfile, resolve
    task = job["task"]
    profile = HardwareProfile(**job["profile"]) if job.get("profile") else resolve(job.get("target"))
    return compile_resources(job["source"], task, dims or job.get("dims") or task["dims"], profile).to_dict()


def do_check(job: dict) -> dict:
    from mtmc.tools.correctness import check
    device = job.get("device", "cpu")
    # CPU tensors only run in the interpreter; on a GPU the sandbox's setting stands.
    ctx = interpreted(True) if device == "cpu" else contextlib.nullcontext()
    with ctx:
        return check(job["task"], job["source"], job.get("dims"), device, int(job.get("trials", 2))).to_dict()


def do_time(job: dict) -> dict:
    """Timing runs at the real shape: the dims of time_task when given, else the task's."""
    from mtmc.tools.timing import time_candidate
    return time_candidate(job.get("time_task") or job["task"], job["source"], bool(job.get("baselines", True)),
                          bool(job.get("compile_baseline", True)))


def do_verify(job: dict) -> dict:
    """compile (with a target) -> check -> time (on a GPU), stopping at the first failure."""
    done: dict = {"passed": False, "failed_at": None}
    steps = []
    if job.get("target"):
        steps.append(("compile", lambda: do_compile(job, job.get("compile_dims")),
                      lambda r: r["ok"]))
    steps.append(("check", lambda: do_check(job), lambda r: r["ok"]))
    if job.get("device", "cpu") == "cuda" and gpu_available():
        steps.append(("time", lambda: do_time(job), lambda r: True))
    for part, run, passed in steps:
        try:
            done[part] = run()
        except Exception as e:
            raise PartError(part, done, e) from e
        if not passed(done[part]):
            done["failed_at"] = part
            return done
    done["passed"] = True
    return done


def do_ping(job: dict) -> dict:
    return {"pid": os.getpid(), "python": sys.version.split()[0], "torch_loaded": "torch" in sys.modules}


def _module_time(kind: str):
    """A whole-module job of tools.module_time (imported only when such a job runs)."""
    def handler(job: dict) -> dict:
        from mtmc.tools import module_time
        return getattr(module_time, f"{kind}_job")(job)
    return handler


def _guard(side: str, name: str):
    """One job of the guard's reference or candidate session (tools.guard.reference / candidate)."""
    def handler(job: dict) -> dict:
        from mtmc.tools.guard import candidate, reference
        return getattr(reference if side == "reference" else candidate, f"{name}_job")(job)
    return handler


def do_layout_probe(job: dict) -> dict:
    from mtmc.tools.layout_probe import probe
    return probe(job)


HANDLERS = {"compile": do_compile, "check": do_check, "time": do_time, "verify": do_verify, "ping": do_ping,
            "module_time": _module_time("time"), "module_eval": _module_time("eval"),
            "module_baseline": _module_time("baseline"), "module_replay_time": _module_time("replay_time"),
            "layout_probe": do_layout_probe,
            **{f"reference_{name}": _guard("reference", name) for name in ("open", "state", "variant", "judge", "close")},
            **{f"candidate_{name}": _guard("candidate", name) for name in ("open", "trial", "time")}}


def error_result(kind, e: BaseException) -> dict:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return {"status": "error", "kind": kind, "error_type": type(e).__name__, "message": str(e)[-4000:],
            "traceback": tb[-8000:]}


def run(job: dict, handlers: dict) -> dict:
    kind = job.get("kind")
    start = time.monotonic()
    try:
        if kind not in handlers:
            raise ValueError(f"unknown job kind {kind!r}; known: {', '.join(handlers)}")
        result = {"status": "ok", "kind": kind, "result": handlers[kind](job)}
    except PartError as e:
        result = {**error_result(kind, e.cause), "part": e.part, "result": e.done}
    except Exception as e:  # MemoryError included: a verdict on the candidate
        result = error_result(kind, e)
    result["job_s"] = time.monotonic() - start
    return result


def _private_stdout():
    """Only our results may reach stdout: keep the real stdout on a private fd and point fd 1
    (and sys.stdout) at stderr, so candidate prints, C-level ones included, go there.  In a
    sandbox started by root, first become the sandbox user (tools.isolation)."""
    from mtmc.tools.isolation import drop_privileges
    drop_privileges()
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    faulthandler.enable(file=sys.stderr)  # a segfault leaves a Python traceback for the debugger
    return result_out


def _answer(out, result: dict) -> None:
    out.write(json.dumps(result, default=repr) + "\n")
    out.flush()
    sys.stderr.flush()


def answer_one(handlers: dict) -> None:
    """One job from stdin, its result on stdout (tools.sandbox.run_job)."""
    result_out = _private_stdout()
    try:
        job = json.loads(sys.stdin.read())
        result = run(job, handlers)
    except Exception as e:  # an unreadable job
        result = error_result(None, e)
    _answer(result_out, result)
    # Skip interpreter teardown: compile threads or a broken CUDA context can hang or crash it.
    os._exit(0)


def serve(handlers: dict) -> None:
    """A session (tools.sandbox.Session): one JSON job per stdin line, one result per stdout line,
    until stdin closes."""
    result_out = _private_stdout()
    _warm(os.environ.get(sandbox.WARM_ENV))
    while True:
        line = sys.stdin.readline()
        if not line:
            break
        try:
            result = run(json.loads(line), handlers)
        except Exception as e:  # an unreadable job
            result = error_result(None, e)
        _release_gpu_memory()
        _answer(result_out, result)
    os._exit(0)


def _warm(device: str | None) -> None:
    """Import torch and Triton, and start CUDA on a GPU, before the first job: a session started
    ahead of its work (the guard's next candidate session) then has its 4-5 s start behind it.
    A failure here is left for the job to meet and report."""
    if not device:
        return
    with contextlib.suppress(Exception):
        import torch
        import triton  # noqa: F401
        if device == "cuda":
            torch.zeros(1, device="cuda")


def _release_gpu_memory() -> None:
    """Between a session's jobs, hand cached GPU blocks back: other processes (the guard's
    reference, the next group's draft) need the memory of a multi-GB draft check."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()


def main(handlers: dict) -> None:
    """An entry module's main: a session with `--serve`, else one job."""
    serve(handlers) if sys.argv[1:] == ["--serve"] else answer_one(handlers)


if __name__ == "__main__":
    main(HANDLERS)
