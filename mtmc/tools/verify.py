"""One verification of a draft: compile for the target, check, time -- in a sandboxed child.

The verdict is plain data the agents route on:
  ok, stage ("compile" | "check" | "time" | "sandbox"), kind (None, or the failure:
  smem_overflow | register_spills | too_many_regs | compile_error | wrong_values |
  runtime_error | timed_out | crashed), detail, resources, correctness, timing, time_ms,
  measured, and baselines (eager / torch.compile ms, when measured on a GPU).
"""
from __future__ import annotations

from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.tools.estimate import estimate_time
from mtmc.tools.hardware import HardwareProfile

# Compiling needs real CPU tensors of the compile dims; past this many elements the check dims
# stand in (resources do not depend on sizes beyond divisibility, which small_dim keeps).
COMPILE_NUMEL_LIMIT = 1 << 27


def gpu_available() -> bool:
    import torch
    return torch.cuda.is_available()


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
    return {"kind": "verify", "spec": spec.to_dict(), "source": source, "dims": check_dims,
            "device": "cuda" if gpu else "cpu", "trials": 2, "target": profile.name,
            "compile_dims": compile_dims, "time_dims": spec.dims, "baselines": baselines,
            "compile_baseline": compile_baseline}


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
        v = resources["violations"][0]
        return _failure("compile", v["kind"], v.get("detail", ""), **base)
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
    common = {k: v for k, v in job.items() if k in ("spec", "source")}
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
            "stderr_tail": (comp.get("stderr_tail") or "") + (chk.get("stderr_tail") or "")}


def verify_draft(spec: KernelSpec, source: str, config: dict, profile: HardwareProfile, *, gpu: bool,
                 timeout_s: float = 240.0, baselines: bool = True, compile_baseline: bool = True) -> dict:
    from mtmc.tools.warm import drafts_pool
    job = build_job(spec, source, config, profile, gpu, baselines, compile_baseline)
    result = _run_split(job, timeout_s, gpu, drafts_pool())
    verdict = interpret(result, spec, config, profile)
    verdict["stderr_tail"] = (result.get("stderr_tail") or "")[-1500:] if not verdict["ok"] else ""
    return verdict
