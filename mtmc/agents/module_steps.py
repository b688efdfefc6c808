"""The steps of the module flow (agents.module_flow, the module graph), as plain functions:
capture in a sandboxed child and the size checks, a group's outcome from its kernel run,
ModelNew written and checked by the guard of `mtmc verify` (groups that break it fall back),
ModelNew timed on a GPU, and the final answer in words.

The upload is never imported here: capture, the check and the timing run in sandboxed children
(timeout, memory limit, no network).  A bad upload (syntax error, missing get_inputs, an import
that hangs or allocates without bound, a forward that raises) ends the run with status
"rejected" and a message that says what went wrong and where; the app keeps running.

Speed decides only where it is measured: on a GPU a group whose best kernel is slower than
PyTorch eager on that group stays PyTorch; without one every group the catalog serves gets its
kernel (times are roofline estimates, labelled so).  A group whose kernel passed its own check
but breaks the whole module's check also stays PyTorch, so the written ModelNew is always the
last version that passed.
"""
from __future__ import annotations

import ast
import os
import tempfile
import time
from pathlib import Path

from mtmc.agents import events as E
from mtmc.kernels.catalog import describe
from mtmc.kernels.drafts import close_idle_references
from mtmc.kernels.spec import KernelSpec
from mtmc.module import worker as module_worker
from mtmc.module.assemble import assemble
from mtmc.module.capture import PHASES, info_bytes, last_phase
from mtmc.module.fusion import Group
from mtmc.module.module_file import ModuleFileError, check_file
from mtmc.tools.guard.report import as_module_check
from mtmc.tools.guard.verifier import ReferenceFailed, ReferenceRun, check_candidate, run_reference
from mtmc.tools.isolation import Confinement, IsolationUnavailable
from mtmc.tools.layout_probe import job_of as layout_job
from mtmc.tools.machine import capture_memory_mb, gib, gpu_memory
from mtmc.tools.worker import run_job

CAPTURE_TIMEOUT_S = 120.0
MEMORY_MB = 8192  # the interpreter's whole-module check on CPU; capture's cap comes from the machine


class Rejected(Exception):
    """The upload cannot be optimized; the message says why in plain words."""


# -- capture --------------------------------------------------------------------------------

def check_syntax(source: str, name: str) -> None:
    """Parse (never run) the upload, so a syntax error is answered at once."""
    try:
        ast.parse(source, filename=name)
    except SyntaxError as e:
        text = f"\n  {e.text.strip()}" if e.text else ""
        raise Rejected(f"{name} has a syntax error at line {e.lineno}: {e.msg}{text}") from None


def capture_in_child(path: str, timeout_s: float = CAPTURE_TIMEOUT_S, memory_mb: int | None = None) -> dict:
    """module.capture's result for the file, from a sandboxed child capped at memory_mb (default:
    machine.capture_memory_mb(), a share of free host memory); Rejected with a clear message
    when the upload cannot be captured."""
    name = os.path.basename(path)
    memory_mb = capture_memory_mb() if memory_mb is None else memory_mb
    try:
        result = module_worker.run_job({"kind": "capture", "path": os.path.abspath(path)}, timeout_s=timeout_s,
                         memory_mb=memory_mb, confine=Confinement(ro=[path]))
    except IsolationUnavailable as e:
        raise Rejected(f"{name}: {e}") from None
    status = result.get("status")
    phase = PHASES.get(last_phase(result.get("stderr_tail") or "") or "", "loading it")
    if status == "timed_out":
        raise Rejected(f"{name}: {phase} did not finish within {timeout_s:g} s (an endless loop, or waiting "
                       "on something that never answers); the child process was stopped")
    if status == "crashed":
        tail = result.get("stderr_tail") or ""
        if "MemoryError" in tail or "memory" in tail.lower() or result.get("returncode") == -9:
            raise Rejected(f"{name}: {phase} ran out of memory (the limit is {memory_mb} MB); the child process died")
        raise Rejected(f"{name}: the child process died while {phase}: {result.get('detail', '')[:500]}")
    if status == "error":
        if result.get("error_type") == "MemoryError":
            raise Rejected(f"{name}: {phase} ran out of memory (the limit is {memory_mb} MB)")
        raise Rejected(f"{name}: capturing the module failed while {phase}: "
                       f"{result.get('error_type')}: {result.get('message', '')[:500]}")
    captured = result["result"]
    if "upload_error" in captured:
        raise Rejected(captured["upload_error"])
    return captured


def memory_needs(captured: dict, gpu: bool) -> dict:
    """Bytes of the upload's inputs, parameters and outputs (known from the capture's shapes), and
    the GPU's free memory when a GPU is used (None when unknown or unused)."""
    need = {"inputs_bytes": info_bytes(captured["inputs"]), "params_bytes": info_bytes(captured["params"].values()),
            "outputs_bytes": info_bytes(captured.get("outputs", []))}
    free = gpu_memory() if gpu else None
    return {**need, "total_bytes": sum(need.values()), "gpu_free_bytes": free[0] if free else None}


def check_fits(name: str, memory: dict) -> None:
    """Rejected when the upload cannot be held on the GPU at its full size.  Without a GPU nothing
    is refused for size: the kernels are checked at cut sizes in Triton's interpreter."""
    free, total = memory["gpu_free_bytes"], memory["total_bytes"]
    if free is not None and total > free:
        raise Rejected(f"{name} is too big for this GPU: its inputs ({gib(memory['inputs_bytes'])}), parameters "
                       f"({gib(memory['params_bytes'])}) and outputs ({gib(memory['outputs_bytes'])}) need "
                       f"{gib(total)} ({total} bytes), and the GPU has {gib(free)} ({free} bytes) free")


def capture_checked(path: str, gpu: bool, timeout_s: float, memory_mb: int | None) -> tuple[dict, dict]:
    """(captured, memory_needs) of the file; Rejected for a bad or too big upload."""
    name = os.path.basename(path)
    try:
        check_file(path)   # .py only, under the upload limit: the chat's rules for the command line too
    except ModuleFileError as e:
        raise Rejected(str(e)) from None
    try:
        check_syntax(Path(path).read_text(), name)
    except (OSError, UnicodeDecodeError) as e:
        raise Rejected(f"cannot read {path}: {e}") from None
    captured = capture_in_child(path, timeout_s, memory_mb)
    memory = memory_needs(captured, gpu)
    check_fits(name, memory)
    return captured, memory


def group_plan(g: Group) -> dict:
    spec = KernelSpec.from_dict(g.spec)
    return {"id": g.id, "graph": g.graph, "family": g.family, "ops": g.ops, "notes": g.notes,
            "spec": {"op": spec.op, "dims": spec.dims, "dtype": spec.dtype, "description": describe(spec)}}


# -- one group through the loop ---------------------------------------------------------------

# A kernel within this share of eager's time is a tie, not a loss: memory-bound ops run at the
# copy bandwidth either way and timing noise decides which is "faster" (L1 5, a scalar multiply:
# 2.016 ms against 2.021), so the user keeps the Triton kernel they asked for.
TIE = 0.01


def outcome_from_state(state: dict, gpu: bool) -> dict:
    """What the loop found for one group: a kernel, or why the group stays PyTorch."""
    best = state.get("best") or {}
    if state.get("status") != "done" or not best:
        return {"status": "fallback", "reason": (state.get("message") or "no draft passed").splitlines()[0]}
    verdict = best.get("verdict") or {}
    baselines = state.get("baselines") or {}
    out = {"status": "kernel", "source": best["source"], "config": best["config"], "step": best.get("step"),
           "correctness": verdict.get("correctness") or {}, "time_ms": best.get("time_ms"),
           "measured": bool(verdict.get("measured")), "eager_ms": baselines.get("eager_ms"),
           "compile_ms": baselines.get("compile_ms"), "resources": verdict.get("resources"),
           "reason": "the catalog serves it"}
    if gpu and out["measured"] and out["eager_ms"] and out["time_ms"] > out["eager_ms"] * (1 + TIE):
        out.update(status="fallback", reason=f"its best kernel ({out['time_ms']:.4f} ms) loses to PyTorch eager "
                   f"({out['eager_ms']:.4f} ms) on the GPU")
    elif not gpu:
        out["reason"] = "no GPU to compare speeds: every group the catalog serves gets its kernel"
    return out


def _emit(on_event, event: E.Event) -> None:
    if on_event:
        on_event(event.to_dict())


# -- assemble and check -----------------------------------------------------------------------

def _kernels(groups: list[Group], outcomes: dict[int, dict], only: set[int] | None = None) -> dict[int, dict]:
    chosen = {}
    for g in groups:
        o = outcomes.get(g.id, {})
        if o.get("status") == "kernel" and (only is None or g.id in only):
            summary = f"config: {o['config']}\ncorrectness: {o['correctness'].get('reason', '')}"
            chosen[g.id] = {"source": o["source"], "config": o["config"], "summary": summary}
    return chosen


INTERPRETER_MAX_ELEMS = 1 << 20  # per input tensor in the interpreter's check: cut along the batch above


LAYOUT_PROBE_TIMEOUT_S = 120.0


def measure_layout(desc: dict, conv: str) -> dict:
    """Conv node `conv` of a captured graph timed as given and channels-last on this GPU, each
    with its error against float64 (tools.layout_probe; our own code with random weights, in a
    child); {"error": why} where it cannot be measured."""
    job = layout_job(desc, conv)
    if job is None:
        return {"error": "a functional conv: its layout is not measured"}
    r = run_job(job, LAYOUT_PROBE_TIMEOUT_S, untrusted=False)
    if r["status"] != "ok":
        return {"error": f"the layout probe failed: {r.get('error_type') or r['status']}: "
                         f"{(r.get('message') or r.get('detail') or '')[:200]}"}
    return r["result"]


def reference_run(upload: str, gpu: bool, timeout_s: float, candidates_in: Path | None = None,
                  tf32: bool = False) -> ReferenceRun | dict:
    """The trusted run of the upload's Model that every ModelNew version is checked against
    (guard.run_reference, once per upload), or the check's result when none can be made;
    candidates_in: the folder ModelNew is written to (its check's session starts meanwhile)."""
    if gpu:   # the groups' idle guard references hold full-size tensors on the GPU
        close_idle_references("cuda")
    try:
        return run_reference(upload, "cuda" if gpu else "cpu", timeout_s, None if gpu else MEMORY_MB,
                             max_elems=None if gpu else INTERPRETER_MAX_ELEMS, candidates_in=candidates_in,
                             tf32=tf32)
    except ReferenceFailed as e:  # capture ran Model, so this is randomness or size, not a broken upload
        return {"status": "skipped", "reason": f"the whole module cannot be checked: {e}; each group's kernel "
                "was checked on its own"}


def check_in_child(path: str, ref: ReferenceRun | dict, timeout_s: float, pytorch_only: bool = False) -> dict:
    """ModelNew at `path` through the same guard as `mtmc verify` (its own sandboxed child, fresh
    inputs, poisoned memory, every cheat check), as {"status": "passed" | "failed" | "skipped",
    "reason", "verdict"}."""
    if isinstance(ref, dict):
        return ref
    v = check_candidate(ref, path, timeout_s, None if ref.device == "cuda" else MEMORY_MB)
    if v["outcome"] == "timed out" and ref.device == "cpu":
        # the interpreter is slow, not wrong: each group's kernel passed its own check
        return {"status": "skipped", "reason": f"the whole module did not finish within {timeout_s:g} s in "
                "Triton's interpreter; each group's kernel was checked on its own", "verdict": v}
    if v["outcome"] == "invalid reference":   # the reference itself failed on fresh inputs: no verdict
        return {"status": "skipped", "reason": f"the whole module cannot be checked: {v['checks'][0]['detail']}; "
                "each group's kernel was checked on its own", "verdict": v}
    return as_module_check(v, pytorch_only)


NOTHING_TO_CHECK = ("not run: no Triton kernel, every group stays PyTorch, so ModelNew runs Model's own "
                    "code (identical by construction)")


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_model_new(source: str, captured: dict, groups: list[Group], outcomes: dict[int, dict], out: Path) -> None:
    """ModelNew with the kernel of every group whose outcome is one, written to `out`."""
    write_text(out, assemble(source, captured, groups, _kernels(groups, outcomes)))


def assemble_checked(upload: str, captured: dict, groups: list[Group], outcomes: dict[int, dict], out: Path,
                     gpu: bool, timeout_s: float, on_event=None, original: dict | None = None,
                     deadline: float | None = None, tf32: bool = False) -> dict:
    """Write ModelNew with every kernel, check it; when the check fails, find the groups that
    break it (by halving, until `deadline`), let them fall back, and write and check again.  `original`:
    the capture before the graph stage rewrote `captured`; when even the all-PyTorch ModelNew of
    the rewritten graph fails, ModelNew is written from it (the result then has
    "rewrites_reverted": why).  With no kernel and no rewrite ModelNew runs Model's own code:
    nothing to check, and at KernelBench size the two sandboxed full-size runs cost a minute on
    the H200.  tf32: the user allowed TF32 products, and the check's fp32 tolerance widens to match."""
    if not _kernels(groups, outcomes) and original is None:
        write_model_new(Path(upload).read_text(), captured, groups, outcomes, out)
        check = {"status": "passed", "reason": NOTHING_TO_CHECK, "verdict": None, "model_own_code": True}
        _emit(on_event, E.ModuleCheck(status=check["status"], reason=check["reason"]))
        return check
    out.parent.mkdir(parents=True, exist_ok=True)
    ref = reference_run(upload, gpu, timeout_s, out.parent, tf32)
    try:
        source = Path(upload).read_text()
        check = _check_until_it_passes(source, ref, captured, groups, outcomes, out, timeout_s, on_event, deadline)
        if gpu and check["status"] == "skipped" and (_kernels(groups, outcomes) or original is not None):
            return _unproven(source, captured if original is None else original, groups, outcomes, out, check,
                             on_event, rewritten=original is not None)
        if check["status"] == "failed" and original is not None and not _kernels(groups, outcomes):
            reason = f"the rewritten graph failed the module check: {check.get('reason', '')}"
            write_text(out, assemble(source, original, [], {}))
            check = check_in_child(str(out), ref, timeout_s, pytorch_only=True)
            check["rewrites_reverted"] = reason
            _emit(on_event, E.ModuleCheck(status=check["status"], reason="graph-stage rewrites reverted: "
                                          + check.get("reason", "")))
        return check
    finally:
        if isinstance(ref, ReferenceRun):
            ref.close()   # its session holds the reference's tensors (on the GPU, several GB)


def _fall_back(outcomes: dict[int, dict], gids: list[int], reason: str, on_event) -> None:
    """Groups `gids` stay PyTorch, for `reason`."""
    for gid in gids:
        outcomes[gid].update(status="fallback", reason=reason)
        _emit(on_event, E.GroupFallback(group=gid, reason=reason))


def _unproven(source: str, captured: dict, groups: list[Group], outcomes: dict[int, dict], out: Path, check: dict,
              on_event, rewritten: bool) -> dict:
    """On a GPU, a module the guard could not check as a whole keeps Model's own code: its kernels
    (each proved alone) are not shipped unproven together (KernelBench L3 Mamba2: Model rejected
    the guard's cut batch, the check was skipped, and the composed kernels missed 1e-2)."""
    reason = f"the whole module could not be checked on the GPU ({check.get('reason', '')}): its kernels are not " \
             "shipped unproven"
    _fall_back(outcomes, list(_kernels(groups, outcomes)), reason, on_event)
    write_text(out, assemble(source, captured, groups, {}))
    result = {"status": "skipped", "reason": reason + "; ModelNew runs Model's own code", "verdict": None,
              "model_own_code": True}
    if rewritten:
        result["rewrites_reverted"] = reason
    _emit(on_event, E.ModuleCheck(status=result["status"], reason=result["reason"]))
    return result


def _check_until_it_passes(source: str, ref: ReferenceRun | dict, captured: dict, groups: list[Group],
                           outcomes: dict[int, dict], out: Path, timeout_s: float, on_event=None,
                           deadline: float | None = None) -> dict:
    """Check ModelNew with every kernel; when that fails, find the groups that break it by
    halving (a set of kernels that passes is cleared at once: a ResNet with one bad group of
    twenty costs ~2 log2(20) checks, not 20), let them fall back and check again.  Past the
    `deadline` (time.time()) the search stops and ModelNew is written all-PyTorch rather than
    late or wrong."""
    def write_and_check(path: Path, kernels: dict, announce: bool = True) -> dict:
        write_text(path, assemble(source, captured, groups, kernels))
        check = check_in_child(str(path), ref, timeout_s, pytorch_only=not kernels)
        if announce:
            _emit(on_event, E.ModuleCheck(status=check["status"], reason=check.get("reason", ""),
                                          phases=(check.get("verdict") or {}).get("phases") or []))
        return check

    def late() -> bool:
        return deadline is not None and time.time() > deadline

    check = write_and_check(out, _kernels(groups, outcomes))
    if check["status"] != "failed" or not _kernels(groups, outcomes):
        return check
    with tempfile.TemporaryDirectory(prefix="mtmc-isolate-") as tmp:
        def breaking(gids: list[int], known_bad: dict | None) -> None:
            """Fall back the groups of `gids` that break the check (`known_bad`: their check,
            already known to fail)."""
            if late():
                _fall_back(outcomes, gids, "the module check failed and the time budget ended before its cause "
                           "was found", on_event)
                return
            one = known_bad or write_and_check(Path(tmp) / f"groups_{gids[0]}_{len(gids)}.py",
                                               _kernels(groups, outcomes, set(gids)), announce=False)
            if one["status"] != "failed":
                return
            if len(gids) == 1:
                _fall_back(outcomes, gids, f"breaks the module check: {one.get('reason', '')}", on_event)
                return
            half = len(gids) // 2
            breaking(gids[:half], None)
            breaking(gids[half:], None)

        breaking(sorted(_kernels(groups, outcomes)), check)
    check = write_and_check(out, _kernels(groups, outcomes))
    if check["status"] == "failed" and _kernels(groups, outcomes):
        # together they still break it: write the all-PyTorch ModelNew rather than a wrong one
        _fall_back(outcomes, list(_kernels(groups, outcomes)),
                   f"the module check failed with it: {check.get('reason', '')}", on_event)
        check = write_and_check(out, {})
    return check


# The launch-overhead action (module.graph_replay): kept when the replayed ModelNew takes at most
# this share of the plain one's time, and tried only on inputs up to REPLAY_MAX_BYTES (a graph
# keeps static copies of them and its own pool of intermediates).
REPLAY_KEEP_SHARE = 0.9
REPLAY_MAX_BYTES = 1 << 30


def replay_choice(upload: str, captured: dict, groups: list[Group], outcomes: dict[int, dict], out: Path,
                  timeout_s: float, on_event=None, tf32: bool = False) -> dict:
    """Write ModelNew with its forward replayed as one CUDA graph, time it against the checked
    plain one on the GPU and, when it is faster, check it with the guard and keep it in place of
    the plain one.  The decision as a record: status applied / not applied / refused, why, the
    times."""
    decision = {"action": "cuda_graph", "plain_ms": None, "replay_ms": None}
    graphed = out.with_name(out.stem + "_replay.py")
    try:
        write_text(graphed, assemble(Path(upload).read_text(), captured, groups, _kernels(groups, outcomes),
                                     replay=True))
        r = run_job({"kind": "module_replay_time", "path": os.path.abspath(out), "other": os.path.abspath(graphed),
                     "device": "cuda"}, confine=Confinement(ro=[str(out), str(graphed)]), timeout_s=timeout_s,
                    interpret=False)
        if r.get("status") != "ok":
            return {**decision, "status": "not applied",
                    "why": f"timing failed: {r.get('message') or r.get('detail', '')}"[:300]}
        t = r["result"]
        decision.update(plain_ms=t["plain_ms"], replay_ms=t["replay_ms"])
        if not t.get("captured"):
            return {**decision, "status": "not applied", "why": "the forward could not be captured as a CUDA graph "
                    "(a host sync or a CPU tensor inside): it ran plainly"}
        if t["replay_ms"] > REPLAY_KEEP_SHARE * t["plain_ms"]:
            return {**decision, "status": "not applied", "why": f"replayed {t['replay_ms']:.4f} ms against "
                    f"{t['plain_ms']:.4f} ms plain: launches are not where the time goes"}
        ref = reference_run(upload, True, timeout_s, out.parent, tf32)
        try:
            check = check_in_child(str(graphed), ref, timeout_s)
        finally:
            if isinstance(ref, ReferenceRun):
                ref.close()
        _emit(on_event, E.ModuleCheck(status=check["status"], reason="replayed as a CUDA graph: "
                                      + check.get("reason", "")))
        if check["status"] != "passed":
            return {**decision, "status": "refused", "why": f"the replayed ModelNew failed the module check: "
                    f"{check.get('reason', '')}"[:400]}
        os.replace(graphed, out)
        return {**decision, "status": "applied", "why": f"replayed {t['replay_ms']:.4f} ms against "
                f"{t['plain_ms']:.4f} ms plain ({t['plain_ms'] / t['replay_ms']:.2f}x), checked by the guard"}
    finally:
        graphed.unlink(missing_ok=True)


def time_in_child(path: str, timeout_s: float) -> dict:
    result = run_job({"kind": "module_time", "path": os.path.abspath(path), "device": "cuda"}, confine=Confinement(ro=[path]),
                     timeout_s=timeout_s, interpret=False)
    if result.get("status") == "ok":
        return result["result"]
    return {"measured": False, "error": f"{result.get('status')}: {result.get('message') or result.get('detail', '')}"[:500]}


def final_message(s: dict) -> str:
    kernels = sum(1 for g in s["groups"] if g["status"] == "kernel")
    if s["status"] == "failed":
        return (f"{s['file']}: ModelNew does not match Model even with every group left to PyTorch "
                f"({s['check'].get('reason', '')}); Model's outputs may be random (dropout in training mode, "
                "random ops) or depend on state. The file was written, unoptimized, to " + s["out"])
    lines = [f"{s['file']}: {len(s['groups'])} fusion group(s), {kernels} with a Triton kernel; ModelNew written to {s['out']}.",
             f"Check: {s['check']['status']}: {s['check'].get('reason', '')}"]
    e2e = s.get("end_to_end")
    if e2e and e2e.get("measured"):
        lines.append(f"End to end: {e2e['ours_ms']:.4f} ms vs eager {e2e['eager_ms']:.4f} ms "
                     f"({e2e['speedup_vs_eager']:.2f}x)" + (f", torch.compile {e2e['compiled_ms']:.4f} ms "
                     f"({e2e['speedup_vs_compiled']:.2f}x)" if e2e.get("compiled_ms") else ""))
    elif not s["gpu"]:
        lines.append("No GPU: speed not measured; per-group times are roofline estimates.")
    return "\n".join(lines)
