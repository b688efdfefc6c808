"""Run the agent graph on one request and stream its events (used by the CLI, the app, bench)."""
from __future__ import annotations

import uuid

from mtmc.agents.context import Context
from mtmc.agents.report import decision_line, verdict_line


def print_event(ev: dict, out) -> None:
    kind = ev.get("event")
    if kind == "parsed":
        print(f"spec: {ev['description']}", file=out)
        for a in ev.get("assumptions", []):
            print(f"  assumption: {a}", file=out)
    elif kind == "retrieved":
        found = ", ".join(f"{h['id']}{' (stale)' if h.get('stale') else ''}" for h in ev.get("histories", []))
        print(f"memory: {ev.get('count', 0)} similar past run(s) on {ev.get('gpu')}" + (f": {found}" if found else "")
              + (f" ({ev['note']})" if ev.get("note") and not found else ""), file=out)
    elif kind == "plan":
        print(f"[plan]   {decision_line(ev)}", file=out)
    elif kind == "code":
        changed = sum(1 for line in ev.get("diff", "").splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---"))
        print(f"[code]   step {ev['step']}: config {ev['config']}" + (f" ({changed} lines changed)" if changed else ""), file=out)
    elif kind == "verify":
        print(f"[verify] step {ev['step']}: {verdict_line(ev['verdict'])}", file=out)
    elif kind == "debug":
        print(f"[debug]  step {ev['step']}: {ev.get('fix') or 'no fix'}: {ev.get('reason', '')}", file=out)
    elif kind == "step":
        print(f"         step {ev['step']} -> {ev['outcome']}", file=out)
    elif kind == "unsupported":
        print(ev["message"], file=out)
    elif kind == "final":
        print(ev["message"], file=out)
    out.flush()


# A run starts from these, also when its thread (a chat conversation) has earlier runs.
FRESH_RUN = {"steps": [], "tried": [], "best": {}, "candidate": {}, "decision": {}, "baselines": {},
             "retrieved": [], "assumptions": [], "artifact": "", "message": "", "status": "running",
             "debug_attempts": 0, "stale_steps": 0}


def run_request(request: str, ctx: Context, thread_id: str | None = None, on_event=None,
                spec: dict | None = None, initial_config: dict | None = None) -> dict:
    """Run the graph on one request; return the final state."""
    from mtmc.agents.graph import checkpointer, compile_graph, recursion_limit
    graph = compile_graph(checkpointer())
    config = {"configurable": {"thread_id": thread_id or uuid.uuid4().hex},
              "recursion_limit": recursion_limit(ctx)}
    inputs = {"request": request, "spec": spec, "initial_config": initial_config, **FRESH_RUN}
    final: dict = {}
    for mode, chunk in graph.stream(inputs, config=config, context=ctx, stream_mode=["custom", "values"]):
        if mode == "custom" and on_event:
            on_event(chunk)
        elif mode == "values":
            final = chunk
    return final


def summary_json(state: dict) -> dict:
    best = state.get("best") or {}
    return {
        "status": state.get("status"), "message": state.get("message"), "spec": state.get("spec"),
        "assumptions": state.get("assumptions", []), "artifact": state.get("artifact"),
        "final_config": best.get("config"), "final_step": best.get("step"),
        "final_time_ms": best.get("time_ms"), "measured": bool((best.get("verdict") or {}).get("measured")),
        "baselines": state.get("baselines"),
        "steps": [{k: v for k, v in s.items() if k != "diff"} for s in state.get("steps", [])],
    }


