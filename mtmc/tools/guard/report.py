"""The verdict in words, for the command line and the app."""
from __future__ import annotations

_MARK = {True: "pass", False: "FAIL", None: " -- "}


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def format_verdict(v: dict) -> str:
    lines = [f"verdict: {v['outcome'].upper()}" + (f"  ({v.get('mode')})" if v.get("mode") else ""),
             f"  reference: {v.get('reference')}", f"  candidate: {v.get('candidate')}"]
    if v.get("variants"):
        lines.append(f"  inputs: fresh random draws, one per variant: {', '.join(v['variants'])}")
    lines.append("checks:")
    lines += [f"  [{_MARK[c['passed']]}] {c['name']}: {c['detail']}" for c in v["checks"]]
    if v.get("max_abs_err") is not None:
        lines.append(f"error: max abs {_num(v['max_abs_err'])}, relative {_num(v['rel_err'])} "
                     f"({_num(v['tol_ratio'])} of the tolerance)")
    t = v.get("timing")
    if t:
        speed = f", {t['speedup_vs_eager']:.2f}x eager" if t.get("speedup_vs_eager") else ""
        lines.append(f"timing on {t.get('gpu')}: ModelNew {t['ours_ms'] * 1e3:.2f} us, eager Model "
                     f"{_num(t['eager_ms'] and t['eager_ms'] * 1e3)} us{speed}")
    else:
        lines.append("timing: not measured (no GPU)" if v.get("device") == "cpu" else "timing: not measured")
    lines += [f"note: {n}" for n in v.get("notes", [])]
    if not v["accepted"] and v.get("stderr_tail"):
        lines += ["candidate stderr (last lines):"] + ["  " + ln for ln in v["stderr_tail"].splitlines()[-12:]]
    return "\n".join(lines)


def phase_line(phases: list) -> str:
    """Where a check's seconds went, from its [[job kind, seconds], ...] in call order: each kind
    once, summed, with a count and each call's seconds where it ran more than once (a session's
    first job includes its start: bubblewrap, Python, torch and CUDA); kinds that took no
    measurable time are left out."""
    each: dict[str, list[float]] = {}
    for kind, seconds in phases:
        each.setdefault(kind, []).append(seconds)
    bits = [f"{kind.replace('_', ' ')} " + (f"{len(s)}x {sum(s):.1f} ({'+'.join(f'{x:.1f}' for x in s)})" if len(s) > 1
                                           else f"{s[0]:.1f}")
            for kind, s in each.items() if sum(s) >= 0.05]
    return f"{sum(map(sum, each.values())):.1f} s: " + ", ".join(bits) if bits else ""


def as_module_check(v: dict, pytorch_only: bool = False) -> dict:
    """The verdict in the shape of the module flow's whole-module check ({"status": "passed" |
    "failed", "reason"}), so the pipeline uses the guard for that check.  pytorch_only: the
    candidate is meant to have no kernel of its own (every group fell back), so own_kernels
    failing is expected, not a reason to reject it."""
    bad = [c for c in v["checks"] if c["passed"] is False and not (pytorch_only and c["name"] == "own_kernels")]
    if not bad and v["outcome"] in ("accepted", "rejected"):
        why = "accepted by every check" if v["accepted"] else "correct; no Triton kernel by design (all PyTorch)"
        corr = next((c["detail"] for c in v["checks"] if c["name"] == "correctness"), "")
        reason = "; ".join([f"{why}: {corr}" if corr else why] + list(v.get("notes", [])))
        return {"status": "passed", "reason": reason, "verdict": v}
    reason = "; ".join(f"{c['name']}: {c['detail']}" for c in bad[:3]) or v["outcome"]
    return {"status": "failed", "reason": f"{v['outcome']}: {reason}", "verdict": v}
