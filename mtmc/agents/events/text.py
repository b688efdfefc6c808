"""Events in words: the one renderer to text (the command line prints its lines), and the
one-line summaries of verdicts, decisions and timings that the chat's bubbles, the finished
kernel's answer and the explainer reuse."""
from __future__ import annotations

from mtmc.agents import events as E
from mtmc.tools.guard.report import phase_line


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
    guard = guard_line(verdict.get("guard"))
    if guard:
        bits.append(guard)
    t = verdict.get("time_ms")
    if t is not None:
        bits.append(f"{t:.4f} ms ({'measured' if verdict.get('measured') else 'estimate, no GPU'})")
    return "; ".join(bits)


def seconds_lines(verdict: dict) -> list[str]:
    """Where a step's seconds went: the draft's compile and check in parallel, then the guard's jobs."""
    parts = verdict.get("seconds") or {}
    if not parts:
        return []
    phases = (verdict.get("guard") or {}).get("phases")
    bits = [f"{k} {v:.1f} s" for k, v in parts.items() if not (k == "guard" and phases)]
    return ["[time]   " + ", ".join(bits + ([f"guard {phase_line(phases)}"] if phases else []))]


def guard_line(guard: dict | None) -> str:
    """The guard's verdict on a draft, in short."""
    if not guard:
        return ""
    if guard.get("skipped"):
        return f"guard: not run ({guard['skipped']})"
    if guard.get("accepted"):
        return f"guard: accepted ({guard.get('checks')} checks)"
    return f"guard: {guard.get('outcome')} ({', '.join(f['name'] for f in guard.get('failed') or []) or 'no verdict'})"


def decision_line(decision: dict) -> str:
    alts = ", ".join(f"{a['action']} p={a['prob']:.2f}" for a in decision.get("alternatives", [])[:4])
    return f"{decision.get('reason', '')}" + (f" [top: {alts}]" if alts else "")


def timing_line(verdict: dict, baselines: dict | None) -> str:
    timing = verdict.get("timing") or {}
    if not verdict.get("measured"):
        return f"time: {verdict.get('time_ms', float('nan')):.4f} ms ({timing.get('label', 'estimate, no GPU')})"
    parts = [f"time: {verdict['time_ms']:.4f} ms measured on {timing.get('device', 'GPU')}"]
    for name in ("eager", "compile"):
        ms = (baselines or {}).get(f"{name}_ms")
        if isinstance(ms, (int, float)) and ms > 0:
            label = "PyTorch eager" if name == "eager" else "torch.compile"
            parts.append(f"{ms / verdict['time_ms']:.2f}x vs {label} ({ms:.4f} ms)")
    return "; ".join(parts)


def _changed_lines(diff: str) -> int:
    return sum(1 for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---"))


def _parsed(ev: E.Parsed) -> list[str]:
    return [f"spec: {ev.description}", *(f"  assumption: {a}" for a in ev.assumptions)]


def _retrieved(ev: E.Retrieved) -> list[str]:
    found = ", ".join(f"{h['id']}{' (stale)' if h.get('stale') else ''}" for h in ev.histories)
    return [f"memory: {ev.count} similar past run(s) on {ev.gpu}" + (f": {found}" if found else "")
            + (f" ({ev.note})" if ev.note and not found else "")]


# what an uncaptured forward means for the run: its submodules are captured on their own
UNCAPTURED = "; its own code outside the submodules captured on their own runs in PyTorch"


def _captured(ev: E.Captured) -> list[str]:
    out = []
    for p in ev.problems:
        what = f"submodule {p['path']}" if p["path"] else "Model.forward"
        out.append(f"could not capture {what}: {p['reason']}" + (f" (at {p['where']})" if p["where"] else "")
                   + UNCAPTURED)
    return out


def _gain(r: dict) -> str:
    g = r.get("predicted_gain_ms")
    return f", predicted {'gain' if g > 0 else 'loss'} {abs(g) * 1e3:.1f} us on the roofline" if isinstance(g, (int, float)) else ""


def _rewritten(ev: E.Rewritten) -> list[str]:
    if not (ev.applied or ev.refused):
        return []
    return ([f"graph stage: {len(ev.applied)} rewrite(s) applied, {len(ev.refused)} not"]
            + [f"  rewrite {r['rule']}: {' -> '.join(r['ops'])} becomes {r['result']} ({r['reason']}{_gain(r)})"
               for r in ev.applied]
            + [f"  not rewritten ({r['rule']}): {' -> '.join(r['ops'])}: {r['reason']}{_gain(r)}" for r in ev.refused])


def _partitioned(ev: E.Partitioned) -> list[str]:
    return ([f"{len(ev.groups)} fusion group(s):"]
            + [f"  group {g['id']} ({g['family']}): {' -> '.join(g['ops'])}" for g in ev.groups]
            + [f"  stays PyTorch: {t['op']}: {t['why']}" for t in ev.torch_ops])


_RENDER = {
    E.Parsed: _parsed,
    E.Retrieved: _retrieved,
    E.Plan: lambda ev: [f"[plan]   {decision_line({'reason': ev.reason, 'alternatives': ev.alternatives})}"],
    E.Code: lambda ev: [f"[code]   step {ev.step}: config {ev.config}"
                        + (f" ({n} lines changed)" if (n := _changed_lines(ev.diff or "")) else "")],
    E.Verify: lambda ev: [f"[verify] step {ev.step}: {verdict_line(ev.verdict)}"] + seconds_lines(ev.verdict),
    E.Debug: lambda ev: [f"[debug]  step {ev.step}: {ev.fix or 'no fix'}: {ev.reason}"],
    E.StepDone: lambda ev: [f"         step {ev.step} -> {ev.outcome}"],
    E.Unsupported: lambda ev: [ev.message],
    E.Final: lambda ev: [ev.message],
    E.Rejected: lambda ev: [ev.message],
    E.Captured: _captured,
    E.Rewritten: _rewritten,
    E.Partitioned: _partitioned,
    E.GroupStart: lambda ev: [f"== group {ev.group}: {ev.description}"],
    E.GroupDone: lambda ev: [f"== group {ev.group}: {ev.status} ({ev.reason})"],
    E.GroupFallback: lambda ev: [f"== group {ev.group} falls back to PyTorch: {ev.reason}"],
    E.ModuleCheck: lambda ev: [f"[module check] {ev.status}: {ev.reason}"]
    + ([f"[time]   module check {phase_line(ev.phases)}"] if ev.phases else []),
    E.ModuleTime: lambda ev: [f"[module time] ours {ev.ours_ms} ms, eager {ev.eager_ms} ms, "
                              f"torch.compile {ev.compiled_ms} ms"],
    E.Replayed: lambda ev: [f"[replay] CUDA graph of the whole forward: {ev.status}: {ev.why}"],
}


def lines(ev: E.Event | dict) -> list[str]:
    """The event in words, as the command line prints it (nothing for an unknown kind)."""
    ev = E.from_dict(ev)
    render = _RENDER.get(type(ev))
    return render(ev) if render else []


def printer(out):
    """An on_event callback that prints each event's lines to `out` as it arrives."""
    def on_event(ev) -> None:
        for line in lines(ev):
            print(line, file=out)
        out.flush()
    return on_event
