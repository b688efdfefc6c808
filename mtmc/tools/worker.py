"""The verifier's child process: `python -m mtmc.tools.worker` reads one JSON job on stdin and
prints one JSON result on stdout; with `--serve` it answers one job per line until stdin closes
(a tools.sandbox.Session).  tools.sandbox starts it; never run candidates elsewhere.

Jobs (every one carries "spec": KernelSpec.to_dict() and "source": the candidate, except ping):
  {"kind": "compile", "dims": {...}?, "target": "h200"?, "profile": {...}?}
                                                                -> {"result": ResourceReport dict}
  {"kind": "check", "dims": {...}?, "device": "cpu"|"cuda", "trials": 2}
                                                                -> {"result": CheckResult dict}
  {"kind": "time", "dims": {...}?, "baselines": true}           -> {"result": timing dict}
  {"kind": "verify", "dims": check dims?, "device": ..., "trials": ..., "target": name or None,
   "compile_dims": {...}?, "time_dims": {...}?, "baselines": true}
        -> {"result": {"passed": bool, "failed_at": part or None, "compile": ..., "check": ...,
                       "time": ...}}  (compile only with a target, time only on a GPU;
           stops at the first part that fails)
  {"kind": "ping"}                                              -> {"result": {"pid", "python"}}
Missing dims mean the spec's, except in verify: compile_dims default to the (small) check dims,
which families choose to keep the real shape's alignment, so the specialization is the same;
time_dims default to the spec's.
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


def _spec(job: dict):
    from mtmc.kernels.spec import KernelSpec
    return KernelSpec.from_dict(job["spec"])


def do_compile(job: dict, dims: dict | None = None) -> dict:
    from mtmc.tools.hardware import HardwareProfile, resolve
    from mtmc.tools.target_compile import compile_resources
    spec = _spec(job)
    profile = HardwareProfile(**job["profile"]) if job.get("profile") else resolve(job.get("target"))
    return compile_resources(job["source"], spec, dims or job.get("dims") or spec.dims, profile).to_dict()


def do_check(job: dict) -> dict:
    from mtmc.tools.correctness import check
    device = job.get("device", "cpu")
    # CPU tensors only run in the interpreter; on a GPU the sandbox's setting stands.
    ctx = interpreted(True) if device == "cpu" else contextlib.nullcontext()
    with ctx:
        return check(_spec(job), job["source"], job.get("dims"), device, int(job.get("trials", 2))).to_dict()


def do_time(job: dict, dims: dict | None = None) -> dict:
    """Timing runs at the real shape: `dims` when given, else the spec's."""
    from mtmc.tools.timing import time_candidate
    return time_candidate(_spec(job), job["source"], dims, bool(job.get("baselines", True)),
                          bool(job.get("compile_baseline", True)))


def _gpu_present() -> bool:
    import torch
    return torch.cuda.is_available()


def do_verify(job: dict) -> dict:
    """compile (with a target) -> check -> time (on a GPU), stopping at the first failure."""
    done: dict = {"passed": False, "failed_at": None}
    steps = []
    if job.get("target"):
        steps.append(("compile", lambda: do_compile(job, job.get("compile_dims")),
                      lambda r: r["ok"]))
    steps.append(("check", lambda: do_check(job), lambda r: r["ok"]))
    if job.get("device", "cpu") == "cuda" and _gpu_present():
        steps.append(("time", lambda: do_time(job, job.get("time_dims")), lambda r: True))
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
    return {"pid": os.getpid(), "python": sys.version.split()[0]}


def _module_job(module: str, name: str):
    """A handler of a whole-module job (capture, module_time, the guard's sessions), imported only
    when such a job runs."""
    def handler(job: dict) -> dict:
        import importlib
        return getattr(importlib.import_module(module), name)(job)
    return handler


HANDLERS = {"compile": do_compile, "check": do_check, "time": lambda job: do_time(job, job.get("dims")),
            "verify": do_verify, "ping": do_ping,
            "capture": _module_job("mtmc.kernels.capture", "capture_job"),
            "module_time": _module_job("mtmc.tools.module_time", "time_job"),
            "module_eval": _module_job("mtmc.tools.module_time", "eval_job"),
            "module_baseline": _module_job("mtmc.tools.module_time", "baseline_job"),
            **{f"reference_{name}": _module_job("mtmc.tools.guard.reference", f"{name}_job")
               for name in ("open", "state", "variant", "judge", "close")},
            **{f"candidate_{name}": _module_job("mtmc.tools.guard.candidate", f"{name}_job")
               for name in ("open", "trial", "time")}}


def error_result(kind, e: BaseException) -> dict:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return {"status": "error", "kind": kind, "error_type": type(e).__name__, "message": str(e)[-4000:],
            "traceback": tb[-8000:]}


def run(job: dict) -> dict:
    kind = job.get("kind")
    start = time.monotonic()
    try:
        if kind not in HANDLERS:
            raise ValueError(f"unknown job kind {kind!r}; known: {', '.join(HANDLERS)}")
        result = {"status": "ok", "kind": kind, "result": HANDLERS[kind](job)}
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


def main() -> None:
    result_out = _private_stdout()
    try:
        job = json.loads(sys.stdin.read())
        result = run(job)
    except Exception as e:  # an unreadable job
        result = error_result(None, e)
    _answer(result_out, result)
    # Skip interpreter teardown: compile threads or a broken CUDA context can hang or crash it.
    os._exit(0)


def serve() -> None:
    """A session (tools.sandbox.Session): one JSON job per stdin line, one result per stdout line,
    until stdin closes."""
    result_out = _private_stdout()
    while True:
        line = sys.stdin.readline()
        if not line:
            break
        try:
            result = run(json.loads(line))
        except Exception as e:  # an unreadable job
            result = error_result(None, e)
        _release_gpu_memory()
        _answer(result_out, result)
    os._exit(0)


def _release_gpu_memory() -> None:
    """Between a session's jobs, hand cached GPU blocks back: other processes (the guard's
    reference, the next group's draft) need the memory of a multi-GB draft check."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    serve() if sys.argv[1:] == ["--serve"] else main()
