"""debug node: read a failed verdict and propose one fixing action, or give up (roll back).

Resource failures have known cures, tried in order of how little they change the kernel:
  shared memory over the limit -> fewer pipeline stages, then a smaller largest tile;
  register spills / too many registers -> more warps (fewer registers per thread), then a
    smaller largest tile, then fewer rows per program.
Wrong values, crashes, time-outs and compile errors of a template config are not patched
blindly: the debugger gives up on that lineage and the draft rolls back to the best one.
"""
from __future__ import annotations

from langgraph.runtime import Runtime

from mtmc.agents import events as E
from mtmc.agents.context import Context
from mtmc.agents.stream import emit
from mtmc.agents.state import State
from mtmc.agents.verifier import step_record
from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.policy.actions import KNOB_KIND, Action, config_key

TILE_KNOBS = ("BLOCK_K", "BLOCK_N", "BLOCK_M", "BLOCK")


def _step(space: dict, config: dict, knob: str, direction: int) -> Action | None:
    values = space.get(knob)
    if not values or config.get(knob) not in values:
        return None
    i = values.index(config[knob]) + direction
    return Action(KNOB_KIND[knob], knob, values[i]) if 0 <= i < len(values) else None


def _largest_tile_down(space: dict, config: dict) -> Action | None:
    tiles = sorted((k for k in TILE_KNOBS if k in config), key=lambda k: -config[k])
    for knob in tiles:
        action = _step(space, config, knob, -1)
        if action:
            return action
    return None


def _stages_that_fit(space: dict, config: dict, violation: dict) -> Action | None:
    """Shared memory of a pipelined loop grows with its stages: jump straight to the most stages
    predicted to fit, rather than stepping down one at a time."""
    stages, shared, limit = config.get("num_stages"), violation.get("shared_bytes"), violation.get("limit_bytes")
    if not (stages and shared and limit) or stages <= 1:
        return None
    fit = max(1, int(stages * limit / shared))
    legal = [v for v in space.get("num_stages", []) if v <= min(fit, stages - 1)]
    return Action(KNOB_KIND["num_stages"], "num_stages", max(legal)) if legal else None


def candidate_fixes(kind: str, space: dict, config: dict, violation: dict | None = None) -> list[tuple[Action | None, str]]:
    violation = violation or {}
    if kind == "smem_overflow":
        return [(_stages_that_fit(space, config, violation),
                 f"shared memory grows with pipeline stages: {violation.get('shared_bytes')} B needed, "
                 f"{violation.get('limit_bytes')} B allowed"),
                (_step(space, config, "num_stages", -1), "fewer pipeline stages need less shared memory"),
                (_largest_tile_down(space, config), "a smaller tile needs less shared memory")]
    if kind in ("register_spills", "too_many_regs"):
        return [(_step(space, config, "num_warps", +1), "more warps hold the same tile with fewer registers per thread"),
                (_largest_tile_down(space, config), "a smaller tile needs fewer registers"),
                (_step(space, config, "ROWS_PER_PROG", -1), "fewer rows per program need fewer registers")]
    return []


def propose_fix(spec: KernelSpec, config: dict, verdict: dict, tried: set[str]) -> tuple[Action, str] | None:
    space = family_of(spec).config_space(spec)
    violations = (verdict.get("resources") or {}).get("violations") or [{}]
    for action, why in candidate_fixes(verdict.get("kind") or "", space, config, violations[0]):
        if action and config_key(action.apply(config)) not in tried:
            return action, why
    return None


def debug(state: State, runtime: Runtime[Context]) -> dict:
    spec = KernelSpec.from_dict(state["spec"])
    cand = state["candidate"]
    verdict = cand["verdict"]
    fix = propose_fix(spec, cand["config"], verdict, set(state.get("tried", [])))
    calls: list = []
    if fix is None and runtime.context.llm is not None:   # the deterministic cures are spent: ask the model
        from mtmc.agents.llm_coder import hardware_facts
        from mtmc.agents.llm_debugger import knob_fix
        fix = knob_fix(runtime.context.llm, family_of(spec).config_space(spec), cand["config"], verdict,
                       set(state.get("tried", [])), hardware_facts(runtime.context.target), calls)
        fix = fix and (fix[0], f"the model's fix: {fix[1]}")
    llm_calls = {"llm_calls": state.get("llm_calls", []) + calls} if calls else {}
    if fix is None:
        emit(E.Debug(step=cand["step"], fix=None, reason=f"no safe fix for {verdict.get('kind')}: roll back"))
        return {"debug_attempts": runtime.context.max_debug + 1, **llm_calls}  # routes to rollback
    action, why = fix
    record = step_record(state, f"failed ({verdict.get('kind')}: {verdict.get('detail', '')[:200]}); debugger: {action.label()}")
    decision = {"action": action.to_dict(), "origin": "debugger", "alternatives": [],
                "reason": f"{verdict.get('kind')}: {why}"}
    emit(E.Debug(step=cand["step"], fix=action.label(), reason=decision["reason"]))
    emit(E.build("step", **record))
    return {"decision": decision, "debug_attempts": state.get("debug_attempts", 0) + 1,
            "steps": state.get("steps", []) + [record], **llm_calls}


def route_after_debug(state: State, runtime: Runtime[Context]) -> str:
    return "code" if state.get("debug_attempts", 0) <= runtime.context.max_debug else "rollback"
