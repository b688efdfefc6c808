"""Verify a ModelNew against a Model: two sandboxed children and a verdict judged here.

  ref = run_reference(REFERENCE.py)       # child 1: Model, fresh inputs, float64 truth -> files
                                          # loaded here, then deleted before child 2 starts
  verdict = check_candidate(ref, CANDIDATE.py)   # child 2: ModelNew on copies of the inputs only
  verify(REFERENCE.py, CANDIDATE.py)      # both: what `mtmc verify` calls (and the pipeline can)

The verdict is plain data: outcome ("accepted" | "rejected" | "crashed" (the child died, ran out
of memory or broke its CUDA context) | "timed out" | "invalid reference"), accepted, checks
[{name, passed, detail}], max_abs_err, rel_err, tol_ratio, trials (per input variant, per
output), timing (GPU only), notes and the candidate's stderr tail.
Files only cross the process boundary through torch.load(weights_only=True), so neither child
can run code in this process.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mtmc.tools.guard import checks as C
from mtmc.tools.sandbox import run_job

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MEMORY_MB = 4096       # address-space cap of CPU children (no cap with a GPU: CUDA reserves more)
OUTPUT_SLACK_BYTES = 64 << 20  # a candidate's outputs file may exceed the expected size by this much
# Errors after which the process (or its CUDA context) is unusable: reported as "crashed".
_FATAL_TYPES = ("MemoryError", "AcceleratorError")
_FATAL_MESSAGE = re.compile(r"illegal memory access|CUDA error|unspecified launch failure|out of memory|"
                            r"can't allocate memory", re.I)


class ReferenceFailed(RuntimeError):
    """The reference module could not be run: no verdict on any candidate is possible."""


@dataclass
class ReferenceRun:
    """A trusted reference run, held only in this process."""
    path: str
    device: str
    variants: list
    notes: list
    ops: dict
    float64: bool
    eager_ms: float | None
    init: list
    state: dict
    inputs: list       # per trial: the inputs (CPU)
    eager: list        # per trial: Model's outputs in its own dtype
    ref64: list        # per trial: float64 outputs (or None)
    mode: str = "train"  # "eval" when Model is random in training mode
    extra: dict = field(default_factory=dict)

    def truth(self, i: int) -> list:
        return self.ref64[i] if self.float64 else self.eager[i]

    def flat_inputs(self, i: int) -> list:
        from torch.utils._pytree import tree_flatten
        return tree_flatten(self.inputs[i])[0]

    def nbytes(self, i: int = 0) -> int:
        import torch
        tensors = [t for t in self.flat_inputs(i) + list(self.eager[i]) if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)


def default_device() -> str:
    from mtmc.tools.verify import gpu_available
    return "cuda" if gpu_available() else "cpu"


def _job_failure(result: dict) -> str:
    if result["status"] == "timed_out":
        return f"no result within {result.get('timeout_s', '?')} s; its process group was killed"
    if result["status"] == "crashed":
        return result.get("detail", "the child process died")
    return f"{result.get('error_type')}: {result.get('message', '')}"


def run_reference(path: str | Path, device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                  memory_mb: int = DEFAULT_MEMORY_MB, max_elems: int | None = None) -> ReferenceRun:
    """Model on fresh inputs in a sandboxed child; max_elems cuts the inputs along dim 0 (for
    Triton's interpreter) where Model accepts the smaller batch."""
    import torch
    device = device or default_device()
    path = str(Path(path).resolve())
    tmp = Path(tempfile.mkdtemp(prefix="mtmc-guard-ref-"))
    try:
        r = run_job({"kind": "reference_run", "path": path, "dir": str(tmp), "device": device,
                     "time": device == "cuda", "max_elems": max_elems}, timeout_s, memory_mb, interpret=device == "cpu")
        if r["status"] != "ok":
            raise ReferenceFailed(f"the reference failed: {_job_failure(r)}")
        given = torch.load(tmp / "inputs.pt", weights_only=True)
        refs = torch.load(tmp / "reference.pt", weights_only=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # from here on the reference outputs live only here
    res = r["result"]
    return ReferenceRun(path, device, res["variants"], res["notes"], res["ops"], res["float64"], res["eager_ms"],
                        given["init"], given["state"], given["inputs"], refs["eager"], refs["ref64"], res["mode"])


def _load_saved(path: Path, limit: int) -> tuple[dict | None, str]:
    """The candidate's outputs file, read safely: size-capped, tensors and plain data only."""
    import torch
    if not path.exists():
        return None, "the candidate's child wrote no outputs"
    if path.stat().st_size > limit:
        return None, f"the outputs file is {path.stat().st_size} bytes, far more than the outputs need"
    try:
        saved = torch.load(path, weights_only=True)
    except Exception as e:
        return None, f"the outputs file is unreadable ({type(e).__name__})"
    ok = (isinstance(saved, dict) and all(isinstance(saved.get(k), list) for k in ("outputs", "inputs_after"))
          and all(isinstance(o, list) and all(t is None or isinstance(t, torch.Tensor) for t in o)
                  for o in saved["outputs"] + ([saved["timed"]] if saved.get("timed") is not None else [])))
    return (saved, "") if ok else (None, "the outputs file does not hold the expected lists of tensors")


def _timing(ref: ReferenceRun, obs: dict) -> dict | None:
    ours = obs.get("ours_ms")
    if ours is None:
        return None
    eager = ref.eager_ms
    return {"measured": True, "label": "median of triton.testing.do_bench, L2 flushed", "gpu": obs.get("gpu"),
            "ours_ms": ours, "eager_ms": eager, "speedup_vs_eager": eager / ours if eager and ours > 0 else None}


def _roofline(ref: ReferenceRun, obs: dict) -> dict:
    from mtmc.tools.hardware import get_profile
    if obs.get("ours_ms") is None:
        return C.roofline(None, 0, 0.0, "")
    try:
        prof = get_profile(obs.get("gpu") or "")
    except ValueError:
        return C.check("roofline", None, f"no bandwidth known for {obs.get('gpu')!r}")
    return C.roofline(obs["ours_ms"], ref.nbytes(0), prof.bandwidth_gbs, prof.name)


def judge_candidate(ref: ReferenceRun, obs: dict, saved: dict | None, why_unsaved: str = "") -> dict:
    """The checks and the verdict from a finished candidate child's observations and outputs."""
    saved = saved or {"outputs": [], "inputs_after": [], "timed": None}
    checks = [C.loads(obs), C.runs(obs, len(ref.variants))]
    if why_unsaved and obs.get("trials"):
        checks[1] = C.check("runs", False, why_unsaved)
    checks += [C.timing_functions(obs), C.verifier_hooks(obs), C.threads_and_streams(obs)]
    verdict = {"trials": [], "max_abs_err": None, "rel_err": None, "tol_ratio": None}
    if obs.get("trials"):
        outputs = saved["outputs"][:len(obs["trials"])]
        correct, verdict["trials"], worst = C.correctness(outputs, ref)
        verdict.update(worst)
        checks += [C.inputs_unchanged(ref.inputs, saved["inputs_after"]), C.no_alias(obs),
                   C.output_format(obs, outputs, ref.eager), C.own_kernels(obs, ref.ops), correct,
                   C.precision(outputs, ref), _roofline(ref, obs), C.timed_output(saved.get("timed"), ref)]
    checks.append(C.tolerance_discriminates(ref))
    accepted = all(c["passed"] is not False for c in checks) and checks[1]["passed"] is True
    err = obs.get("error") or {}
    fatal = err.get("type") in _FATAL_TYPES or bool(_FATAL_MESSAGE.search(err.get("message") or ""))
    outcome = "accepted" if accepted else "crashed" if fatal else "rejected"
    verdict.update(outcome=outcome, accepted=accepted, checks=checks, timing=_timing(ref, obs))
    return verdict


def check_candidate(ref: ReferenceRun, path: str | Path, timeout_s: float = DEFAULT_TIMEOUT_S,
                    memory_mb: int = DEFAULT_MEMORY_MB) -> dict:
    import torch
    path = str(Path(path).resolve())
    tmp = Path(tempfile.mkdtemp(prefix="mtmc-guard-cand-"))
    try:
        torch.save({"init": ref.init, "state": ref.state, "mode": ref.mode, "inputs": ref.inputs}, tmp / "inputs.pt")
        r = run_job({"kind": "candidate_run", "path": path, "dir": str(tmp), "device": ref.device,
                     "time": ref.device == "cuda"}, timeout_s, memory_mb, interpret=ref.device == "cpu")
        limit = 8 * sum(ref.nbytes(i) for i in range(len(ref.variants))) + OUTPUT_SLACK_BYTES
        saved, why = _load_saved(tmp / "outputs.pt", limit) if r["status"] == "ok" else (None, "")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = {"reference": ref.path, "candidate": path, "device": ref.device,
            "mode": "GPU" if ref.device == "cuda" else "Triton interpreter on CPU tensors",
            "variants": ref.variants, "notes": list(ref.notes), "stderr_tail": (r.get("stderr_tail") or "")[-3000:]}
    if r["status"] in ("timed_out", "crashed"):
        outcome = "timed out" if r["status"] == "timed_out" else "crashed"
        return {**base, "outcome": outcome, "accepted": False, "checks": [C.check("runs", False, _job_failure(r))],
                "trials": [], "max_abs_err": None, "rel_err": None, "tol_ratio": None, "timing": None}
    if r["status"] != "ok":
        obs = {"error": {"stage": "verifier", "type": r.get("error_type"), "message": r.get("message", "")}}
        return {**base, **judge_candidate(ref, obs, None)}
    return {**base, **judge_candidate(ref, r["result"], saved, why)}


def verify(reference: str | Path, candidate: str | Path, device: str | None = None,
           timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB) -> dict:
    """The full verification of CANDIDATE's ModelNew against REFERENCE's Model, on fresh inputs."""
    try:
        ref = run_reference(reference, device, timeout_s, memory_mb)
    except ReferenceFailed as e:
        return {"reference": str(reference), "candidate": str(candidate), "outcome": "invalid reference",
                "accepted": False, "checks": [C.check("reference", False, str(e))], "trials": [],
                "max_abs_err": None, "rel_err": None, "tol_ratio": None, "timing": None, "notes": []}
    return check_candidate(ref, candidate, timeout_s, memory_mb)
