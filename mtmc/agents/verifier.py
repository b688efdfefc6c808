"""verify node, and what happens after a verdict: accept, or roll back to the best draft."""
from __future__ import annotations

from langgraph.runtime import Runtime

from mtmc.agents import events as E
from mtmc.agents.context import Context
from mtmc.agents.stream import emit
from mtmc.agents.state import State
from mtmc.kernels.drafts import verify_draft
from mtmc.kernels.spec import KernelSpec
from mtmc.policy.actions import config_key
from mtmc.tools.hardware import gpu_available, resolve


def verify(state: State, runtime: Runtime[Context]) -> dict:
    ctx = runtime.context
    spec = KernelSpec.from_dict(state["spec"])
    cand = state["candidate"]
    use_gpu = gpu_available() if ctx.use_gpu is None else ctx.use_gpu
    verdict = verify_draft(spec, cand["source"], cand["config"], resolve(ctx.target), gpu=use_gpu,
                           timeout_s=ctx.timeout_s, baselines=not state.get("baselines"),
                           compile_baseline=ctx.compile_baseline, best_ms=(state.get("best") or {}).get("time_ms"))
    emit(E.Verify(step=cand["step"], verdict=verdict))
    update = {"candidate": {**cand, "verdict": verdict, "time_ms": verdict.get("time_ms")},
              "tried": state.get("tried", []) + [config_key(cand["config"])]}
    if verdict.get("baselines"):
        update["baselines"] = verdict["baselines"]
    return update


def route_after_verify(state: State, runtime: Runtime[Context]) -> str:
    if state["candidate"]["verdict"]["ok"]:
        return "accept"
    return "debug" if state.get("debug_attempts", 0) < runtime.context.max_debug else "rollback"


def step_record(state: State, outcome: str) -> dict:
    cand, decision = state["candidate"], state["decision"]
    return {
        "step": cand["step"], "origin": decision.get("origin"), "action": decision["action"],
        "reason": decision.get("reason", ""), "alternatives": decision.get("alternatives", []),
        "policy": decision.get("policy"), "config": cand["config"], "diff": cand.get("diff", ""),
        "verdict": cand["verdict"], "time_ms": cand.get("time_ms"), "outcome": outcome,
        "history": decision.get("history"),
    }


def accept(state: State) -> dict:
    """A verified draft becomes the best one if it is faster (or the first good one)."""
    cand, best = state["candidate"], state.get("best") or {}
    if not best or cand["time_ms"] < best["time_ms"]:
        gain = "" if not best else f" ({best['time_ms'] / cand['time_ms']:.2f}x faster than step {best['step']})"
        outcome = f"accepted{gain}"
        update = {"best": cand, "stale_steps": 0}
    else:
        outcome = (f"correct but not faster ({cand['time_ms']:.4f} ms vs {best['time_ms']:.4f} ms): "
                   f"kept step {best['step']}")
        update = {"stale_steps": state.get("stale_steps", 0) + 1}
    record = step_record(state, outcome)
    emit(E.build("step", **record))
    return {**update, "steps": state.get("steps", []) + [record]}


def rollback(state: State) -> dict:
    best = state.get("best") or {}
    where = f"rolled back to step {best['step']}" if best else "no correct draft to fall back to"
    record = step_record(state, f"failed ({state['candidate']['verdict'].get('kind')}); {where}")
    emit(E.build("step", **record))
    return {"steps": state.get("steps", []) + [record], "stale_steps": state.get("stale_steps", 0) + 1}


def route_after_rollback(state: State) -> str:
    return "plan" if state.get("best") else "finalize"
