"""Words for people: one-line summaries of verdicts, decisions and steps (CLI and chat)."""
from __future__ import annotations


def resources_line(resources: dict | None) -> str:
    if not resources:
        return ""
    kernels = resources.get("kernels") or []
    parts = []
    for k in kernels:
        parts.append(f"{k.get('name', 'kernel')}: {k.get('regs', '?')} regs, "
                     f"{k.get('spill_bytes', 0)} B spilled, {k.get('shared_bytes', 0)} B smem")
    return "; ".join(parts)


def verdict_line(verdict: dict) -> str:
    if not verdict.get("ok"):
        return f"FAILED at {verdict.get('stage')}: {verdict.get('kind')}: {verdict.get('detail', '')[:300]}"
    bits = ["correct"]
    corr = verdict.get("correctness") or {}
    if corr:
        bits.append(f"max rel err {corr.get('max_rel_err', float('nan')):.2g} of tolerance on {corr.get('device')} dims {corr.get('dims')}")
    res = resources_line(verdict.get("resources"))
    if res:
        bits.append(res)
    t = verdict.get("time_ms")
    if t is not None:
        bits.append(f"{t:.4f} ms ({'measured' if verdict.get('measured') else 'estimate, no GPU'})")
    return "; ".join(bits)


def decision_line(decision: dict) -> str:
    alts = ", ".join(f"{a['action']} p={a['prob']:.2f}" for a in decision.get("alternatives", [])[:4])
    return f"{decision.get('reason', '')}" + (f" [top: {alts}]" if alts else "")
