"""plan node (macro): choose the next action for the best draft, or stop."""
from __future__ import annotations

from langgraph.runtime import Runtime

from mtmc.agents import events as E
from mtmc.agents.context import Context
from mtmc.agents.stream import emit
from mtmc.agents.state import State
from mtmc.kernels.spec import KernelSpec
from mtmc.policy import baseline
from mtmc.tools.hardware import resolve


def history_used(state: State, warm_start: str | None) -> dict:
    """What a decision drew on from memory: the history the lineage started from (its final
    config was the first draft) and the histories retrieved for this spec."""
    return {"warm_start": warm_start, "retrieved": [h["id"] for h in state.get("retrieved") or []]}


def plan(state: State, runtime: Runtime[Context]) -> dict:
    ctx = runtime.context
    spec = KernelSpec.from_dict(state["spec"])
    best = state["best"]
    measured = bool(best.get("verdict", {}).get("measured"))
    moves = sum(1 for s in state.get("steps", []) if s.get("origin") == "planner")
    decision = baseline.decide(
        spec, best["config"], resolve(ctx.target), tried=set(state.get("tried", [])),
        measured=measured, steps_taken=moves, max_steps=ctx.max_steps,
        stale_steps=state.get("stale_steps", 0), patience=ctx.patience,
    ).to_dict()
    decision["origin"] = "planner"
    first = (state.get("steps") or [{}])[0]
    decision["history"] = history_used(state, (first.get("history") or {}).get("warm_start"))
    emit(E.build("plan", step=len(state.get("steps", [])), **decision))
    return {"decision": decision, "debug_attempts": 0}


def route_after_plan(state: State) -> str:
    return "finalize" if state["decision"]["action"]["kind"] == "stop" else "code"
