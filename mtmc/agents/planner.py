"""plan node (macro): choose the next action for the best draft, or stop.

The planner is the learned policy (policy.learned: the RL-trained actor-critic over the learned
cost model, falling back to the baseline where it has no checkpoint or family);
Context.planner = "baseline", or MTMC_PLANNER=baseline in the environment, runs the greedy
roofline baseline (policy.baseline) instead, for comparison.
"""
from __future__ import annotations

import os
import time

from langgraph.runtime import Runtime

from mtmc.agents import events as E
from mtmc.agents.context import Context
from mtmc.agents.stream import emit
from mtmc.agents.state import State
from mtmc.kernels.spec import KernelSpec
from mtmc.policy import baseline, learned
from mtmc.policy.dataset import resources_of
from mtmc.tools.hardware import resolve

PLANNERS = ("policy", "baseline")


def history_used(state: State, warm_start: str | None) -> dict:
    """What a decision drew on from memory: the history the lineage started from (its final
    config was the first draft) and the histories retrieved for this spec."""
    return {"warm_start": warm_start, "retrieved": [h["id"] for h in state.get("retrieved") or []]}


def which_planner(ctx: Context) -> str:
    """MTMC_PLANNER when set, else the context's choice."""
    name = os.environ.get("MTMC_PLANNER") or ctx.planner
    if name not in PLANNERS:
        raise ValueError(f"unknown planner {name!r}; choose one of {', '.join(PLANNERS)}")
    return name


def last_verdict(state: State) -> str:
    """The last step's verdict in the policy's words (policy.env.VERDICTS)."""
    steps = state.get("steps") or []
    if len(steps) <= 1:
        return "start"
    last = steps[-1]
    verdict = last.get("verdict") or {}
    if verdict.get("ok"):
        return "faster" if str(last.get("outcome", "")).startswith("accepted") else "slower"
    # built but wrong (the quick check or the guard); a compile failure, timeout or crash otherwise
    return "wrong" if verdict.get("stage") in ("check", "guard") else "compile_error"


def plan(state: State, runtime: Runtime[Context]) -> dict:
    ctx = runtime.context
    spec = KernelSpec.from_dict(state["spec"])
    best = state["best"]
    verdict = best.get("verdict") or {}
    measured = bool(verdict.get("measured"))
    moves = sum(1 for s in state.get("steps", []) if s.get("origin") == "planner")
    out_of_time = ctx.deadline is not None and time.time() >= ctx.deadline   # a module's time budget
    common = dict(tried=set(state.get("tried", [])), measured=measured, steps_taken=moves,
                  max_steps=min(moves, ctx.max_steps) if out_of_time else ctx.max_steps,
                  stale_steps=state.get("stale_steps", 0), patience=ctx.patience)
    hw = resolve(ctx.target)
    if which_planner(ctx) == "baseline":
        decision = baseline.decide(spec, best["config"], hw, **common)
    else:
        report = verdict.get("resources")
        decision = learned.decide(spec, best["config"], hw, **common,
                                  current_ms=best.get("time_ms") if measured else None,
                                  last_verdict=last_verdict(state),
                                  resources=resources_of(report) if isinstance(report, dict) else None)
    decision = decision.to_dict()
    if out_of_time:
        decision["reason"] = "the module's time budget is spent"
    calls: list = []
    if ctx.llm is not None and not out_of_time and _model_may_choose(decision, moves, ctx, state):
        from mtmc.agents.llm_planner import choose
        decision = choose(ctx.llm, spec, best["config"], decision, best.get("time_ms") if measured else None,
                          None if ctx.target == "auto" else ctx.target, calls)
    decision["origin"] = "planner"
    first = (state.get("steps") or [{}])[0]
    decision["history"] = history_used(state, (first.get("history") or {}).get("warm_start"))
    emit(E.build("plan", step=len(state.get("steps", [])), **decision))
    out = {"decision": decision, "debug_attempts": 0}
    if calls:
        out["llm_calls"] = list(state.get("llm_calls") or []) + calls
    return out


def _model_may_choose(decision: dict, moves: int, ctx: Context, state: State) -> bool:
    """The model picks among the policy's moves only where a move is still allowed: budget left,
    patience not spent, and at least one move besides stop on the list."""
    return (moves < ctx.max_steps and state.get("stale_steps", 0) < ctx.patience
            and any(a.get("kind") != "stop" for a in decision.get("alternatives") or []))


def route_after_plan(state: State) -> str:
    return "finalize" if state["decision"]["action"]["kind"] == "stop" else "code"
