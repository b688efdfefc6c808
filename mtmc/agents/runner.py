"""Run the agent graph on one request and stream its events (used by the CLI, the app, bench)."""
from __future__ import annotations

import uuid

from mtmc.agents.context import Context


# A run starts from these, also when its thread (a chat conversation) has earlier runs.
FRESH_RUN = {"steps": [], "tried": [], "best": {}, "candidate": {}, "decision": {}, "baselines": {},
             "retrieved": [], "assumptions": [], "artifact": "", "message": "", "status": "running",
             "debug_attempts": 0, "stale_steps": 0, "llm_calls": [], "custom": None, "alternative": None}


def run_request(request: str, ctx: Context, thread_id: str | None = None, on_event=None,
                spec: dict | None = None, initial_config: dict | None = None) -> dict:
    """Run the graph on one request; return the final state."""
    from mtmc.agents.graph import checkpointer, compile_graph, recursion_limit
    graph = compile_graph(checkpointer())
    config = {"configurable": {"thread_id": thread_id or uuid.uuid4().hex},
              "recursion_limit": recursion_limit(ctx)}
    inputs = {"request": request, "spec": spec, "initial_config": initial_config, **FRESH_RUN}
    return stream_run(graph, inputs, config, ctx, on_event)


def stream_run(graph, inputs: dict, config: dict, ctx: Context, on_event=None) -> dict:
    """Run a compiled graph, handing each custom-stream event (a dict of mtmc.agents.events) to
    on_event as it comes; the final state."""
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


