"""Verify a ModelNew against a Model: two sandboxed sessions, and a verdict judged here.

  ref = run_reference(REFERENCE.py)       # session 1: Model built on the device, kept there; it
                                          # draws fresh inputs per variant and judges outputs
                                          # (session 2 starts beside it, empty: see _Spare)
  verdict = check_candidate(ref, CANDIDATE.py)   # session 2: ModelNew on its own copies of the inputs
  ref.close()
  verify(REFERENCE.py, CANDIDATE.py)      # both: what `mtmc verify` calls

Per variant: the reference draws the inputs and computes Model's outputs and float64 truth (they
stay in its session); the candidate gets the inputs, runs, and hands its outputs back; the
reference compares them on the device and answers with numbers.  Tensors cross between the two
sessions as CUDA IPC handles on a GPU, and as small files in a private directory on the CPU
(guard.exchange): no multi-GB files, and the reference's outputs never reach the candidate.

The verdict is plain data: outcome ("accepted" | "rejected" | "crashed" (the child died, ran out
of memory or broke its CUDA context) | "timed out" | "invalid reference"), accepted, checks
[{name, passed, detail}], max_abs_err, rel_err, tol_ratio, trials (per input variant, per
output), timing (GPU only), notes and the candidate's stderr tail.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mtmc.tools.guard import checks as C
from mtmc.tools.isolation import SANDBOX_UID, Confinement, fresh_uid, give_to_sandbox, kill_uid, readable_in_place
from mtmc.tools.worker import Session

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MEMORY_MB = 4096       # address-space cap of CPU children (no cap with a GPU: CUDA reserves more)
EXCHANGE_SLACK_BYTES = 64 << 20  # a candidate's shared-outputs file may exceed its expected size by this much
# Errors after which the process (or its CUDA context) is unusable: reported as "crashed".
_FATAL_TYPES = ("MemoryError", "AcceleratorError")
_FATAL_MESSAGE = re.compile(r"illegal memory access|CUDA error|unspecified launch failure|out of memory|"
                            r"can't allocate memory", re.I)


@dataclass
class _Spare:
    """A candidate session started before its candidate is written, so that its start (bubblewrap,
    Python, torch, CUDA: 4-5 s on a GPU machine) overlaps the reference's opening or the work
    between two checks.  It sees `folder` read-only (where the caller writes its candidates: a
    candidate may import its siblings there) and `directory`, the check's exchange directory."""
    session: Session
    folder: str
    directory: Path
    memory_mb: int | None

    def fits(self, path: str, memory_mb: int | None) -> bool:
        return (self.session.alive and self.memory_mb == memory_mb and os.path.dirname(path) == self.folder
                and readable_in_place(path))

    def discard(self) -> None:
        self.session.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class ReferenceFailed(RuntimeError):
    """The reference module could not be run: no verdict on any candidate is possible."""


@dataclass
class ReferenceRun:
    """A trusted reference session, held by this process: close it when done (or use `with`)."""
    path: str
    device: str
    session: Session
    exchange: Path        # the private directory tensors cross through (guard.exchange)
    variants: list
    notes: list
    mode: str = "train"   # "eval" when Model is random in training mode
    timeout_s: float = DEFAULT_TIMEOUT_S
    uid: int | None = None   # the sessions' own uid on a GPU run (tools.isolation.fresh_uid)
    extra: dict = field(default_factory=dict)
    clock: list = field(default_factory=list)   # [job kind, seconds] not yet reported in a verdict
    candidates_in: str | None = None   # the folder its candidates will be in, when the caller knows it
    spare: _Spare | None = None   # the next check's candidate session, already starting (see _Spare)
    keep_spare: bool = False      # start the next one after each check (a reference checked many times)

    def call(self, kind: str, timeout_s: float | None = None, **job) -> dict:
        r = self.session.call({"kind": kind, **job}, timeout_s or self.timeout_s)
        self.clock.append([kind, round(r.get("wall_s", 0.0), 2)])
        if r["status"] != "ok":
            raise ReferenceFailed(f"the reference failed: {_job_failure(r)}")
        return r["result"]

    def close(self) -> None:
        if self.spare is not None:
            self.spare.discard()
            self.spare = None
        self.session.close()
        kill_uid(self.uid)   # anything a candidate left running under the check's uid
        shutil.rmtree(self.exchange, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def default_device() -> str:
    from mtmc.tools.hardware import gpu_available
    return "cuda" if gpu_available() else "cpu"


def _job_failure(result: dict) -> str:
    if result["status"] == "timed_out":
        return f"no result within {result.get('timeout_s', '?')} s; its process group was killed"
    if result["status"] == "crashed":
        return result.get("detail", "the child process died")
    return f"{result.get('error_type')}: {result.get('message', '')}"


def _confinement(path: str, shared: Path, exchange: Path, device: str, uid: int | None) -> Confinement:
    """What a guard session sees: its module file, the directory it shares with the other session,
    and on a GPU: the GPU, one /dev/shm for both (CUDA IPC's reference counts live there) and the
    host's PID namespace (CUDA IPC handles cannot cross PID namespaces), under the check's own uid."""
    if device != "cuda":
        return Confinement(ro=[path], rw=[str(shared)])
    shm = exchange / "shm"
    shm.mkdir(exist_ok=True)
    return Confinement(ro=[path], rw=[str(shared)], gpu=True, shm=str(shm), share_pid=True, uid=uid)


def run_reference(path: str | Path, device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                  memory_mb: int | None = DEFAULT_MEMORY_MB, max_elems: int | None = None,
                  candidates_in: str | Path | None = None, tf32: bool = False) -> ReferenceRun:
    """Model in a sandboxed session, ready to check candidates against; max_elems cuts the
    inputs along dim 0 (for Triton's interpreter) where Model accepts the smaller batch.
    candidates_in: the folder the candidates will be written to; the first candidate's session
    then starts beside the reference's (check_candidate's memory_mb must be this memory_mb).
    tf32: the user allowed TF32 products: fp32 outputs are judged with a TF32-sized tolerance."""
    device = device or default_device()
    path = str(Path(path).resolve())
    exchange = Path(tempfile.mkdtemp(prefix="mtmc-guard-"))
    uid = fresh_uid() if device == "cuda" else None
    try:
        session = Session(interpret=device == "cpu", memory_mb=None if device == "cuda" else memory_mb,
                          name="guard-reference", confine=_confinement(path, exchange, exchange, device, uid),
                          warm=device)
    except BaseException:
        shutil.rmtree(exchange, ignore_errors=True)
        raise
    ref = ReferenceRun(path, device, session, exchange, [], [], timeout_s=timeout_s, uid=uid,
                       candidates_in=os.path.realpath(candidates_in) if candidates_in else None)
    try:
        ref.spare = _start_spare(ref, None if device == "cuda" else memory_mb)
        opened = ref.call("reference_open", path=path, device=device, time=device == "cuda", max_elems=max_elems,
                          tf32=tf32)
    except BaseException:
        ref.close()
        raise
    ref.variants, ref.notes, ref.mode = opened["variants"], opened["notes"], opened["mode"]
    _split_open(ref.clock, opened.get("seconds") or {})
    return ref


def _split_open(clock: list, laps: dict) -> None:
    """The opening's own parts in place of its one entry (what is left of it: the session's start,
    and the waits), so a verdict's phases say which part is slow; the total is unchanged."""
    if not clock or clock[-1][0] != "reference_open" or not laps:
        return
    kind, wall = clock.pop()
    clock.append([kind, round(max(0.0, wall - sum(laps.values())), 2)])
    clock += [[f"{kind} {part}", secs] for part, secs in laps.items()]


def _timing(metas: list, obs: dict) -> dict | None:
    ours = obs.get("ours_ms")
    if ours is None:
        return None
    eager = metas[0].get("eager_ms") if metas else None
    return {"measured": True, "label": "median of triton.testing.do_bench, L2 flushed", "gpu": obs.get("gpu"),
            "ours_ms": ours, "eager_ms": eager, "speedup_vs_eager": eager / ours if eager and ours > 0 else None}


def _roofline(metas: list, obs: dict) -> dict:
    from mtmc.tools.hardware import get_profile
    if obs.get("ours_ms") is None:
        return C.roofline(None, 0, 0.0, "")
    try:
        prof = get_profile(obs.get("gpu") or "")
    except ValueError:
        return C.check("roofline", None, f"no bandwidth known for {obs.get('gpu')!r}")
    return C.roofline(obs["ours_ms"], metas[0]["nbytes"], prof.bandwidth_gbs, prof.name)


def judge_candidate(obs: dict, metas: list, judged: list, timed: dict | None, n_variants: int,
                    why_unjudged: str = "") -> dict:
    """The checks and the verdict from the candidate's observations and the reference's
    judgement of its outputs."""
    checks = [C.loads(obs), C.runs(obs, n_variants)]
    if why_unjudged and obs.get("trials"):
        checks[1] = C.check("runs", False, why_unjudged)
    checks += [C.timing_functions(obs), C.verifier_hooks(obs), C.threads_and_streams(obs)]
    verdict = {"trials": [], "max_abs_err": None, "rel_err": None, "tol_ratio": None}
    if judged:
        ref_ops = metas[0]["ops"]
        correct, verdict["trials"], worst = C.correctness(judged, metas)
        verdict.update(worst)
        checks += [C.inputs_unchanged(judged), C.state_follows(judged), C.no_alias(obs), C.output_format(obs, judged),
                   C.own_kernels(obs, ref_ops), correct, C.result_caching(judged, metas),
                   C.precision(judged, all(m["float64"] for m in metas)), _roofline(metas, obs), C.timed_output(timed)]
    if metas:
        checks.append(C.tolerance_discriminates(metas))
    accepted = all(c["passed"] is not False for c in checks) and checks[1]["passed"] is True
    err = obs.get("error") or {}
    fatal = err.get("type") in _FATAL_TYPES or bool(_FATAL_MESSAGE.search(err.get("message") or ""))
    outcome = "accepted" if accepted else "crashed" if fatal else "rejected"
    verdict.update(outcome=outcome, accepted=accepted, checks=checks, timing=_timing(metas, obs))
    return verdict


class _CandidateStopped(Exception):
    """The candidate's session timed out, crashed or could not answer: the verdict says which."""

    def __init__(self, result: dict):
        super().__init__(result.get("status"))
        self.result = result


def _ask(session: Session, job: dict, timeout_s: float, clock: list) -> dict:
    r = session.call(job, timeout_s)
    clock.append([job["kind"], round(r.get("wall_s", 0.0), 2)])
    if r["status"] != "ok":
        raise _CandidateStopped(r)
    return r["result"]


def _run_trials(ref: ReferenceRun, cand: Session, path: str, directory: str, timeout_s: float) -> tuple:
    """Drive both sessions through the variants: (obs, metas, judged, timed, notes, why_unjudged).
    Every job's seconds go to ref.clock, in call order."""
    clock = ref.clock
    state = ref.call("reference_state", dir=directory)
    obs = _ask(cand, {"kind": "candidate_open", "path": path, "device": ref.device, "payload": state["payload"],
                      "dir": directory}, timeout_s, clock)
    metas, judged, timed, notes = [], [], None, []
    for i in range(len(ref.variants)):
        if not obs.get("loaded") or obs.get("error"):
            break
        meta = ref.call("reference_variant", index=i, dir=directory)
        metas.append(meta)
        notes += meta["notes"]
        res = _ask(cand, {"kind": "candidate_trial", "index": i, "payload": meta.pop("payload"), "dir": directory,
                          "poison_bytes": meta["out_bytes"]}, timeout_s, clock)
        obs = res["obs"]
        if res["payload"] is None:
            break
        limit = 8 * meta["nbytes"] + EXCHANGE_SLACK_BYTES
        try:
            judged.append(ref.call("reference_judge", payload=res["payload"], limit_bytes=limit))
        except ReferenceFailed as e:  # the candidate handed back something that is no set of tensors
            return obs, metas, judged, timed, notes, f"its outputs could not be judged: {e}"
        if i == 0 and ref.device == "cuda":
            res = _ask(cand, {"kind": "candidate_time", "dir": directory}, timeout_s, clock)
            obs = res["obs"]
            if res["payload"] is not None:
                timed = ref.call("reference_judge", payload=res["payload"], limit_bytes=limit)
    return obs, metas, judged, timed, notes, ""


def _start_spare(ref: ReferenceRun, memory_mb: int | None) -> _Spare | None:
    """A candidate session for the next check of `ref`, starting now (see _Spare); None where the
    candidates' folder is not known, or where a candidate's own session would not see that whole
    folder (isolation.readable_in_place): a spare must see nothing more than it would."""
    if ref.candidates_in is None or not readable_in_place(ref.candidates_in):
        return None
    return _session(ref, memory_mb, ref.candidates_in)


def _session(ref: ReferenceRun, memory_mb: int | None, sees: str) -> _Spare:
    """A candidate session that sees `sees` read-only, with a fresh exchange directory."""
    directory = Path(tempfile.mkdtemp(prefix="check-", dir=ref.exchange))
    give_to_sandbox(directory, ref.uid or SANDBOX_UID)   # the reference session writes its inputs there too
    try:
        session = Session(interpret=ref.device == "cpu", memory_mb=memory_mb, name="guard-candidate",
                          confine=_confinement(sees, directory, ref.exchange, ref.device, ref.uid), warm=ref.device)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return _Spare(session, sees, directory, memory_mb)


def _candidate_session(ref: ReferenceRun, path: str, memory_mb: int | None) -> _Spare:
    """The started spare where it fits this candidate, else a session started now."""
    spare, ref.spare = ref.spare, None
    if spare is not None and spare.fits(path, memory_mb):
        return spare
    if spare is not None:
        spare.discard()
    return _session(ref, memory_mb, path)


def check_candidate(ref: ReferenceRun, path: str | Path, timeout_s: float = DEFAULT_TIMEOUT_S,
                    memory_mb: int | None = DEFAULT_MEMORY_MB) -> dict:
    path = str(Path(path).resolve())
    spare = _candidate_session(ref, path, None if ref.device == "cuda" else memory_mb)
    cand, directory = spare.session, spare.directory
    base = {"reference": ref.path, "candidate": path, "device": ref.device,
            "mode": "GPU" if ref.device == "cuda" else "Triton interpreter on CPU tensors",
            "variants": ref.variants, "notes": list(ref.notes)}
    try:
        obs, metas, judged, timed, notes, why = _run_trials(ref, cand, path, str(directory), timeout_s)
    except ReferenceFailed as e:
        base["phases"] = _phases(ref)
        if not ref.session.alive:   # it died while the candidate ran beside it: the candidate's doing
            return {**base, "outcome": "crashed", "accepted": False, "trials": [], "max_abs_err": None,
                    "rel_err": None, "tol_ratio": None, "timing": None,
                    "checks": [C.check("runs", False, f"the reference's session died during this check: {e}")]}
        return {**base, "outcome": "invalid reference", "accepted": False, "checks": [C.check("reference", False, str(e))],
                "trials": [], "max_abs_err": None, "rel_err": None, "tol_ratio": None, "timing": None}
    except _CandidateStopped as stop:
        base["phases"] = _phases(ref)
        r = stop.result
        base["stderr_tail"] = (r.get("stderr_tail") or "")[-3000:]
        if r["status"] in ("timed_out", "crashed"):
            outcome = "timed out" if r["status"] == "timed_out" else "crashed"
            return {**base, "outcome": outcome, "accepted": False,
                    "checks": [C.check("runs", False, _job_failure(r))], "trials": [], "max_abs_err": None,
                    "rel_err": None, "tol_ratio": None, "timing": None}
        obs = {"error": {"stage": "verifier", "type": r.get("error_type"), "message": r.get("message", "")}}
        return {**base, **judge_candidate(obs, [], [], None, len(ref.variants))}
    finally:
        tail = cand.stderr_tail()
        spare.discard()
        if ref.keep_spare and ref.session.alive:
            ref.spare = _start_spare(ref, spare.memory_mb)
    base["notes"] = list(dict.fromkeys(base["notes"] + notes))
    base["stderr_tail"] = tail
    base["phases"] = _phases(ref)
    return {**base, **judge_candidate(obs, metas, judged, timed, len(ref.variants), why)}


def _phases(ref: ReferenceRun) -> list:
    """The seconds of every job since the last verdict (the reference's opening included, when this
    is its first check), as [[kind, seconds], ...]; the clock starts over."""
    phases, ref.clock = ref.clock, []
    return phases


def invalid_reference(reference: str | Path, candidate: str | Path, error: Exception) -> dict:
    """The verdict when the reference itself cannot run: no candidate can be judged."""
    return {"reference": str(reference), "candidate": str(candidate), "outcome": "invalid reference",
            "accepted": False, "checks": [C.check("reference", False, str(error))], "trials": [],
            "max_abs_err": None, "rel_err": None, "tol_ratio": None, "timing": None, "notes": []}


def verify(reference: str | Path, candidate: str | Path, device: str | None = None,
           timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int | None = DEFAULT_MEMORY_MB) -> dict:
    """The full verification of CANDIDATE's ModelNew against REFERENCE's Model, on fresh inputs."""
    try:
        ref = run_reference(reference, device, timeout_s, memory_mb)
    except ReferenceFailed as e:
        return invalid_reference(reference, candidate, e)
    with ref:
        return check_candidate(ref, candidate, timeout_s, memory_mb)
