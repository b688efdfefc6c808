"""One verification of a draft, cheap checks first:

  1. compile for the target GPU (registers, spills, shared memory against its limits) and a quick
     check against the float64 reference, side by side in warm sandboxed sessions (tools.warm;
     on a GPU the quick check also times the draft);
  2. the guard of `mtmc verify` (tools.guard) on the draft as a module pair (kernels.module_pair):
     its own sandboxed sessions, fresh inputs of several kinds, poisoned outputs, inputs left
     unchanged, output format, its own kernels doing the work, the tolerance, no result caching.
     A draft becomes a step's result only when the guard accepts it.

The verdict is plain data the agents route on:
  ok, stage ("compile" | "check" | "guard" | "time" | "sandbox"), kind (None, or the failure:
  smem_overflow | register_spills | too_many_regs | compile_error | wrong_values |
  runtime_error | timed_out | crashed | guard_rejected), detail, resources, correctness, guard
  (outcome and the failed checks), timing, time_ms, measured, and baselines (eager /
  torch.compile ms, when measured on a GPU).
"""
from __future__ import annotations

import atexit
import json
import threading
from collections import OrderedDict
from contextlib import contextmanager

from mtmc.kernels.catalog import family_of
from mtmc.kernels.estimate import estimate_time
from mtmc.kernels.module_pair import PairChecker
from mtmc.kernels.spec import KernelSpec
from mtmc.kernels.task import task_of
from mtmc.tools.hardware import HardwareProfile
from mtmc.tools.warm import drafts_pool

# Compiling needs real CPU tensors of the compile dims; past this many elements the family's small
# check dims stand in (resources do not depend on sizes beyond divisibility, which small_dim keeps).
COMPILE_NUMEL_LIMIT = 1 << 27
# Past this many elements (inputs + output) a draft's guard runs at the family's small check dims
# and its correctness check at full size runs once, not twice: on the H200 a KernelBench input of
# 1.6e9 fp32 elements made every draft cost tens of seconds of float64 truths (one per guard
# variant), so modules ran past their time limit.  Full-size correctness still decides each draft,
# and the assembled module is checked by the guard at its real size.
GUARD_FULL_NUMEL = 1 << 26


def _numel(spec: KernelSpec, dims: dict) -> int:
    fam = family_of(spec)
    return sum(_prod(a.concrete_shape(dims)) for a in fam.inputs(spec) + [fam.output(spec)])


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def build_job(spec: KernelSpec, source: str, config: dict, profile: HardwareProfile, gpu: bool,
              baselines: bool, compile_baseline: bool = True) -> dict:
    small = family_of(spec).check_dims(spec, config)
    check_dims = spec.dims if gpu else small
    # the small dims, never the GPU's check dims (the full size): a 6 GB placeholder broke the compile
    compile_dims = spec.dims if _numel(spec, spec.dims) <= COMPILE_NUMEL_LIMIT else small
    huge = gpu and _numel(spec, spec.dims) > GUARD_FULL_NUMEL
    return {"kind": "verify", "task": task_of(spec), "source": source, "dims": check_dims,
            "guard_dims": small if huge else check_dims,
            "device": "cuda" if gpu else "cpu", "trials": 1 if huge else 2, "target": profile.name,
            "compile_dims": compile_dims, "baselines": baselines, "compile_baseline": compile_baseline}


def _failure(stage: str, kind: str, detail: str, **parts) -> dict:
    return {"ok": False, "stage": stage, "kind": kind, "detail": detail, "time_ms": None,
            "measured": False, **parts}


def interpret(result: dict, spec: KernelSpec, config: dict, profile: HardwareProfile) -> dict:
    status = result.get("status")
    if status == "timed_out":
        return _failure("sandbox", "timed_out", f"verification did not finish in {result.get('timeout_s', '?')} s")
    if status == "crashed":
        return _failure("sandbox", "crashed", result.get("detail") or result.get("stderr_tail", "")[-2000:])
    parts = result.get("result") or {}
    resources, correctness, timing = parts.get("compile"), parts.get("check"), parts.get("time")
    base = {"resources": resources, "correctness": correctness}
    if status == "error":
        stage = result.get("part") or "sandbox"
        kind = "compile_error" if stage == "compile" else "runtime_error"
        return _failure(stage, kind, f"{result.get('error_type')}: {result.get('message', '')}"[:3000], **base)
    if parts.get("failed_at") == "compile":
        violations = resources.get("violations") or [
            {"kind": "compile_error", "detail": "no Triton kernel was compiled: launch() ran none"}]
        return _failure("compile", violations[0]["kind"], violations[0].get("detail", ""), **base)
    if parts.get("failed_at") == "check":
        return _failure("check", "wrong_values", correctness.get("reason", ""), **base)
    verdict = {"ok": True, "stage": "done", "kind": None, "detail": "", **base}
    if timing:
        verdict.update(timing=timing, time_ms=timing["ours_ms"], measured=True)
        if timing.get("eager_ms") is not None:
            verdict["baselines"] = {"eager_ms": timing["eager_ms"], "compile_ms": timing.get("compiled_ms"),
                                    "compile_note": timing.get("compiled_note")}
    else:
        est = estimate_time(spec, config, profile, resources)
        verdict.update(timing=est, time_ms=est["ms"] if est.get("ms") is not None else float("inf"),
                       measured=False)
    return verdict


def _run_split(job: dict, timeout_s: float, gpu: bool, pool) -> dict:
    """The compile for the target (on the CPU, interpreter off: Triton fixes the mode when it is
    first imported) and the check (the interpreter on CPU tensors, or the GPU, with the timing)
    run side by side in two warm sessions, merged into the shape of one verify result."""
    from concurrent.futures import ThreadPoolExecutor
    common = {k: v for k, v in job.items() if k in ("task", "source")}
    compile_job = {**common, "kind": "compile", "dims": job["compile_dims"], "target": job["target"]}
    if gpu:
        check_kind, check_job = "gpu", {**job, "target": None}   # verify = check, then time on the GPU
    else:
        check_kind, check_job = "check", {**common, "kind": "check", "dims": job["dims"], "device": "cpu",
                                          "trials": job["trials"]}
    with ThreadPoolExecutor(2) as threads:
        comp = threads.submit(pool.run, "compile", compile_job, timeout_s)
        chk = threads.submit(pool.run, check_kind, check_job, timeout_s)
        comp, chk = comp.result(), chk.result()
    for part, res in (("compile", comp), ("check", chk)):
        if res.get("status") != "ok":
            return {**res, "part": res.get("part") or part,
                    "result": {"compile": comp.get("result")} if part == "check" else {}}
    checked = chk["result"] if gpu else {"check": chk["result"]}
    merged = {"compile": comp["result"], "check": checked.get("check"), "passed": False, "failed_at": None}
    if checked.get("time"):
        merged["time"] = checked["time"]
    if not comp["result"]["ok"]:
        merged["failed_at"] = "compile"
    elif not (checked.get("check") or {}).get("ok"):
        merged["failed_at"] = "check"
    else:
        merged["passed"] = True
    return {"status": "ok", "kind": "verify", "result": merged,
            "seconds": {"compile": round(comp.get("wall_s", 0.0), 2), check_kind: round(chk.get("wall_s", 0.0), 2)},
            "stderr_tail": (comp.get("stderr_tail") or "") + (chk.get("stderr_tail") or "")}


MAX_REFERENCES = 4          # guard references kept open (a module's groups run side by side)
_CHECKERS: OrderedDict[tuple, PairChecker] = OrderedDict()
_CHECKERS_LOCK = threading.Lock()


def _lend(key: tuple) -> PairChecker | None:
    """The open checker of `key`, lent (under _CHECKERS_LOCK); None when there is none alive."""
    found = _CHECKERS.get(key)
    if found is not None and not found.alive and not found.lent:
        _CHECKERS.pop(key).close()
        found = None
    if found is not None:
        _CHECKERS.move_to_end(key)
        found.lent += 1
    return found


def _close_idle(device: str, keep: tuple | None) -> None:
    """Close the references on `device` that no check holds, but `keep` (under _CHECKERS_LOCK)."""
    for k in [k for k, c in _CHECKERS.items() if k[2] == device and k != keep and not c.lent]:
        _CHECKERS.pop(k).close()


@contextmanager
def _checker(spec: KernelSpec, dims: dict, device: str, timeout_s: float):
    """The open guard reference for this spec at these dims, lent for one check (opened on first
    use, opened again when its session died; past MAX_REFERENCES the oldest one not lent out is
    closed).  On a GPU the reference holds full-size tensors there (tens of GB at KernelBench
    size), so before one opens every idle GPU reference of another spec is closed; the draft
    loop's next guarded draft of the same spec reuses it (on the H200 each new reference cost
    ~20 s of a task's time)."""
    key = (spec.key(), json.dumps(dims, sort_keys=True), device)
    with _CHECKERS_LOCK:
        found = _lend(key)
        if found is None and device == "cuda":
            _close_idle(device, key)
    if found is None:   # opened outside the lock: other groups' checks go on meanwhile
        opened = PairChecker(spec, dims, device, timeout_s)
        with _CHECKERS_LOCK:
            found = _lend(key)
            if found is None:
                found = _CHECKERS[key] = opened
                found.lent += 1
            else:
                opened.close()
            for old in [k for k, c in _CHECKERS.items() if not c.lent][:max(0, len(_CHECKERS) - MAX_REFERENCES)]:
                _CHECKERS.pop(old).close()
    try:
        yield found
    finally:
        with _CHECKERS_LOCK:
            found.lent -= 1


def close_idle_references(device: str) -> None:
    """Close the open references on `device` that no check holds: before another full-size
    reference opens on a GPU (the module check's), the groups' idle ones give back their memory."""
    with _CHECKERS_LOCK:
        _close_idle(device, None)


def close_checkers() -> None:
    with _CHECKERS_LOCK:
        while _CHECKERS:
            _CHECKERS.popitem()[1].close()


atexit.register(close_checkers)


# a guard check about the tolerance itself, not about the draft: it decides nothing here
_NOT_THE_DRAFTS = {"tolerance_discriminates"}


def guard_verdict(spec: KernelSpec, source: str, dims: dict, gpu: bool, timeout_s: float) -> dict:
    """The guard's verdict on the draft at `dims`, in short: {"accepted", "outcome", "failed":
    [{name, detail}], "checks": number of checks that ran}."""
    with _checker(spec, dims, "cuda" if gpu else "cpu", timeout_s) as checker:
        v = checker.check(source)
    failed = [{"name": c["name"], "detail": c["detail"]} for c in v["checks"]
              if c["passed"] is False and c["name"] not in _NOT_THE_DRAFTS]
    ran = [c for c in v["checks"] if c["passed"] is not None]
    accepted = v["outcome"] == "accepted" or (v["outcome"] == "rejected" and not failed)
    return {"accepted": accepted, "outcome": v["outcome"], "failed": failed, "checks": len(ran),
            "phases": v.get("phases") or [], "stderr_tail": "" if accepted else (v.get("stderr_tail") or "")[-1500:]}


def _guard_failure(verdict: dict, guard: dict) -> dict:
    kind = {"timed out": "timed_out", "crashed": "crashed"}.get(guard["outcome"], "guard_rejected")
    if kind == "guard_rejected" and [f["name"] for f in guard["failed"]] == ["correctness"]:
        kind = "wrong_values"
    detail = "; ".join(f"{f['name']}: {f['detail']}" for f in guard["failed"]) or guard["outcome"]
    return _failure("guard", kind, f"the guard of mtmc verify rejected it: {detail}"[:3000],
                    resources=verdict.get("resources"), correctness=verdict.get("correctness"), guard=guard)


def verify_draft(spec: KernelSpec, source: str, config: dict, profile: HardwareProfile, *, gpu: bool,
                 timeout_s: float = 240.0, baselines: bool = True, compile_baseline: bool = True,
                 best_ms: float | None = None) -> dict:
    """The verdict on a draft.  The guard runs on a draft that passed the cheap checks and can
    become the result: the first, or one faster than `best_ms` (the best draft so far); a
    correct but slower one is kept out of the result by its time alone (verdict["guard"]:
    {"skipped": why})."""
    job = build_job(spec, source, config, profile, gpu, baselines, compile_baseline)
    result = _run_split(job, timeout_s, gpu, drafts_pool())
    verdict = interpret(result, spec, config, profile)
    # where the step's seconds went, the guard's added below (printed as the step's [time] line)
    verdict["seconds"] = dict(result.get("seconds") or {})
    verdict["stderr_tail"] = (result.get("stderr_tail") or "")[-1500:] if not verdict["ok"] else ""
    if not verdict["ok"]:
        return verdict            # the cheap checks failed: the guard has nothing to add
    if best_ms is not None and not verdict["time_ms"] < best_ms:
        verdict["guard"] = {"skipped": f"not faster than the best draft ({best_ms:.4f} ms): it cannot become the result"}
        return verdict
    guard = guard_verdict(spec, source, job["guard_dims"], gpu, timeout_s)
    guard["dims"] = job["guard_dims"]
    verdict["seconds"]["guard"] = round(sum(s for _, s in guard["phases"]), 2)
    if not guard["accepted"]:
        failure = _guard_failure(verdict, guard)
        failure["seconds"] = verdict["seconds"]
        failure["stderr_tail"] = guard.pop("stderr_tail")
        return failure
    guard.pop("stderr_tail")
    verdict["guard"] = guard
    return verdict
