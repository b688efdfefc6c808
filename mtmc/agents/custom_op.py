"""The graph's branch for an op outside the catalog (issue 18): the parser role read the words as
a PyTorch reference with its inputs (state["custom"]), and the same flow as a template run
follows, with the model as the coder:

  parse -> custom_draft -> custom_verify -+-> custom_accept -> custom_plan -+-> custom_code -> custom_verify ...
                                          |                                +-> custom_finalize
                                          +-> custom_debug -> custom_code -> custom_verify  (bounded)
                                          +-> rollback -> custom_plan | custom_finalize

The planner picks one macro move among the legal ones (a custom op has no template knobs, so the
moves are instructions: tile size, warps, vector width, a grid that fills the SMs), the coder
applies it to the best draft, the guard checks every draft in its sandboxed child against the
reference as `Model`, and the debugger role (agents.llm_debugger) writes a fix from the verdict.
A step that stays rejected rolls back to the last accepted draft.  Nothing the model writes runs
in this process."""
from __future__ import annotations

import uuid
from pathlib import Path

from langgraph.runtime import Runtime

from mtmc.agents import events as E
from mtmc.agents.context import Context
from mtmc.agents.llm_coder import ask_for_draft, hardware_facts, reference_module, verdict_line
from mtmc.agents.state import State
from mtmc.agents.stream import emit
from mtmc.agents.verifier import step_record
from mtmc.agents.coder import source_diff
from mtmc.request.llm_parse import CustomOp
from mtmc.tools.guard.report import format_verdict
from mtmc.tools.guard.verifier import ReferenceFailed, check_candidate, run_reference
from mtmc.tools.hardware import gpu_available, resolve
from mtmc.tools.llm import LLMFailure
from mtmc.tools.paths import artifacts_dir, home

# The planner's legal moves for a custom op, in the order it tries them: each is one change the
# coder can make to any elementwise/row kernel, and each states the hardware fact behind it.
MOVES = {
    "tile": "Double the elements each program handles (its BLOCK size) so fewer, fuller programs cover "
            "the input; keep loads coalesced and masked.",
    "warps": "Launch with num_warps=8 and make the block size a multiple of 8 * 32 * 4 elements so every "
             "thread issues 128-bit loads.",
    "grid": "Size the grid to fill every SM ({sms} on this GPU) at least twice; if the input is larger, "
            "let each program loop over several blocks (a grid-stride loop).",
}


def custom_op(state: State) -> CustomOp:
    c = state["custom"]
    return CustomOp(c["name"], c["reference"], c["inputs"])


def describe_custom(state: State) -> str:
    c = state["custom"]
    return f"{c['name']} (outside the catalog) on " + ", ".join(
        f"{'x'.join(map(str, i['shape']))} {i['dtype']}" for i in c["inputs"])


def _failed(state: State, message: str) -> dict:
    emit(E.Final(status="failed", message=message))
    return {"status": "failed", "message": message}


def _draft_update(state: State, source: str | None, base: dict, why: str) -> dict:
    step = len(state.get("steps", []))
    diff = source_diff(base.get("source", ""), source or "")
    emit(E.Code(step=step, config={}, diff=diff, origin=state["decision"].get("origin")))
    return {"candidate": {"config": {}, "source": source or "", "step": step, "diff": diff, "no_code": source is None,
                          "why": why}}


def custom_draft(state: State, runtime: Runtime[Context]) -> dict:
    """Step 0: the reference becomes a module file the guard runs as `Model`; the model writes the
    first draft."""
    op = custom_op(state)
    work = home() / "custom" / uuid.uuid4().hex[:12]
    work.mkdir(parents=True, exist_ok=True)
    ref_path = work / "reference.py"
    ref_path.write_text(reference_module(op))
    decision = {"action": {"kind": "init", "knob": None, "value": None}, "origin": "llm-coder",
                "reason": "first draft: written by the model for the reference", "alternatives": [], "history": None}
    update = {"custom": {**state["custom"], "reference_path": str(ref_path)}, "decision": decision,
              "best": {}, "debug_attempts": 0, "stale_steps": 0}
    try:
        source = ask_for_draft(runtime.context.llm, op, "Write the first draft.", None, calls := [],
                               runtime.context.target)
    except LLMFailure as exc:
        return {**update, **_failed(state, f"{describe_custom(state)}: the model could not be used ({exc}); "
                                           "no kernel was written"), "llm_calls": state.get("llm_calls", []) + calls}
    emit(E.Code(step=0, config={}, diff="", origin="llm-coder"))
    return {**update, "llm_calls": state.get("llm_calls", []) + calls,
            "candidate": {"config": {}, "source": source or "", "step": 0, "no_code": source is None}}


def route_after_draft(state: State) -> str:
    return "custom_finalize" if state.get("status") == "failed" else "custom_verify"


def custom_verify(state: State, runtime: Runtime[Context]) -> dict:
    """The guard on the candidate, in its sandboxed child, against the reference as Model."""
    ctx, cand = runtime.context, state["candidate"]
    if cand.get("no_code"):
        verdict = {"ok": False, "kind": "no code", "stage": "reply", "detail": "the reply held no ```python code block",
                   "report": "the reply held no ```python code block.", "measured": False}
    else:
        path = Path(state["custom"]["reference_path"]).parent / f"draft_{cand['step']}_{len(state.get('steps', []))}.py"
        path.write_text(cand["source"])
        use_gpu = gpu_available() if ctx.use_gpu is None else ctx.use_gpu
        try:
            with run_reference(state["custom"]["reference_path"], "cuda" if use_gpu else "cpu", ctx.timeout_s) as ref:
                verdict = guard_verdict(check_candidate(ref, path, ctx.timeout_s))
        except ReferenceFailed as exc:
            verdict = {"ok": False, "kind": "invalid reference", "stage": "reference", "detail": str(exc),
                       "report": str(exc), "measured": False}
    emit(E.Verify(step=cand["step"], verdict=verdict))
    return {"candidate": {**cand, "verdict": verdict, "time_ms": verdict.get("time_ms")}}


def guard_verdict(g: dict) -> dict:
    """The guard's verdict in the shape the step records (and the explainer) read."""
    failed = [c for c in g.get("checks", []) if c.get("passed") is False]
    timing = g.get("timing") or {}
    return {"ok": bool(g.get("accepted")), "kind": g.get("outcome") if g.get("accepted") else
            (failed[0]["name"] if failed else g.get("outcome")), "stage": "guard",
            "detail": failed[0]["detail"] if failed else "", "summary": verdict_line(g),
            "report": format_verdict(g)[:3000], "measured": timing.get("ours_ms") is not None,
            "time_ms": timing.get("ours_ms"), "timing": timing, "max_abs_err": g.get("max_abs_err")}


def route_after_verify(state: State, runtime: Runtime[Context]) -> str:
    if state["candidate"]["verdict"]["ok"]:
        return "custom_accept"
    if state["candidate"]["verdict"]["kind"] == "invalid reference":   # no fix of the draft can help
        return "rollback"
    return "custom_debug" if state.get("debug_attempts", 0) < runtime.context.max_debug else "rollback"


def custom_accept(state: State) -> dict:
    """An accepted draft becomes the best one unless both were timed and it is slower (in the
    interpreter nothing is timed: the planner's move is kept because the guard accepted it)."""
    cand, best = state["candidate"], state.get("best") or {}
    slower = best and cand.get("time_ms") is not None and best.get("time_ms") is not None \
        and cand["time_ms"] >= best["time_ms"]
    if slower:
        outcome, update = (f"correct but not faster ({cand['time_ms']:.4f} ms vs {best['time_ms']:.4f} ms): "
                           f"kept step {best['step']}"), {"stale_steps": state.get("stale_steps", 0) + 1}
    else:
        timed = "" if cand.get("time_ms") is None else f" ({cand['time_ms']:.4f} ms)"
        outcome, update = f"accepted by the guard{timed}", {"best": cand, "stale_steps": 0}
    record = step_record(state, outcome)
    emit(E.build("step", **record))
    return {**update, "steps": state.get("steps", []) + [record]}


def custom_plan(state: State, runtime: Runtime[Context]) -> dict:
    """The next macro move: the first legal move not yet made, with the alternatives left; stop
    when none is left, the step budget is spent, or timed moves stopped paying."""
    ctx = runtime.context
    hw = resolve(ctx.target)
    made = {(s.get("action") or {}).get("value") for s in state.get("steps", []) if s.get("origin") == "planner"}
    left = [m for m in MOVES if m not in made]
    moves = len(made)
    if not left or moves >= ctx.max_steps or state.get("stale_steps", 0) >= ctx.patience:
        why = ("every macro move was made" if not left else f"the step budget ({ctx.max_steps}) is spent"
               if moves >= ctx.max_steps else f"{ctx.patience} moves in a row did not beat the best draft")
        decision = {"action": {"kind": "stop", "knob": None, "value": None}, "origin": "planner",
                    "reason": f"stop: {why}", "alternatives": []}
    else:
        move = left[0]
        decision = {"action": {"kind": "macro", "knob": "move", "value": move}, "origin": "planner",
                    "reason": f"{move}: {MOVES[move].format(sms=hw.sms)} ({hardware_facts(ctx.target)})",
                    "alternatives": [{"action": f"move={m}", "prob": 1.0 / len(left)} for m in left[1:]]}
    emit(E.build("plan", step=len(state.get("steps", [])), **decision))
    return {"decision": decision, "debug_attempts": 0}


def route_after_plan(state: State) -> str:
    return "custom_finalize" if state["decision"]["action"]["kind"] == "stop" else "custom_code"


def custom_code(state: State, runtime: Runtime[Context]) -> dict:
    """The coder applies the decision's one change: a planner move to the best draft, or the
    debugger's fix to the rejected candidate."""
    decision = state["decision"]
    fixing = decision.get("origin") == "debugger"
    base = state["candidate"] if fixing else state["best"]
    instruction = decision["instruction"] if fixing else \
        MOVES[decision["action"]["value"]].format(sms=resolve(runtime.context.target).sms)
    calls: list = []
    try:
        source = ask_for_draft(runtime.context.llm, custom_op(state), instruction, base.get("source") or None,
                               calls, runtime.context.target, role=decision.get("role", "coder"))
    except LLMFailure:   # recorded in calls; handled as a reply without code (debug, then roll back)
        source = None
    update = _draft_update(state, source, base, instruction)
    return {**update, "llm_calls": state.get("llm_calls", []) + calls}


def custom_finalize(state: State, runtime: Runtime[Context]) -> dict:
    """Write the last accepted draft with the reference it was checked against."""
    if state.get("status") == "failed":
        return {}
    best = state.get("best") or {}
    what = describe_custom(state)
    if not best:
        return _failed(state, f"No draft of {what} passed the guard; the steps above say why. It stays unserved.")
    name = state["custom"]["name"]
    path = Path(runtime.context.out_path or artifacts_dir() / f"custom_{name}.py")
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = (f'"""{what}: the model\'s kernel (step {best["step"]}), accepted by the guard: '
               f'{best["verdict"].get("summary", "")}.\nModelNew is the kernel; Model (below) the reference."""\n')
    reference = reference_module(custom_op(state)).replace("import torch\n", "", 1)
    path.write_text(summary + best["source"] + "\n\n# -- the reference it was checked against --\n" + reference)
    msg = (f"{what}: best draft is step {best['step']}, written by the model and accepted by the guard "
           f"({best['verdict'].get('summary', '')}).\nKernel file: {path}\n"
           "Memory: not stored (a custom op has no catalog spec to index it by)")
    emit(E.Final(status="done", message=msg, artifact=str(path)))
    return {"status": "done", "message": msg, "artifact": str(path), "history_id": None}
