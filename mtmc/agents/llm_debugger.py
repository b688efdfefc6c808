"""The debugger role with a model (issue 18): given a failing verdict (compile error text,
resource report, mismatch statistics, the failing input variant, stderr), the model proposes one
fix, after the deterministic fixes were tried.

- A template draft: the deterministic cures (agents.debugger.candidate_fixes) come first; when
  none is left the model picks one knob move among the legal values of the family's
  config_space (prompts/debugger.md, JSON), checked for legality here; the verifier judges it.
- A custom op's draft (agents.custom_op): a reply without code is asked again for the file (the
  deterministic fix); any other rejection goes to the model with the verdict, and it writes the
  fixed file, which the guard checks like any draft.
Without a model, or when it cannot be used, the debugger gives up as before (a roll-back)."""
from __future__ import annotations

import json

from langgraph.runtime import Runtime

from mtmc.agents import events as E
from mtmc.agents.context import Context
from mtmc.agents.state import State
from mtmc.agents.stream import emit
from mtmc.agents.verifier import step_record
from mtmc.policy.actions import KNOB_KIND, Action, config_key
from mtmc.tools.llm import LLMFailure, ask_json, prompt

ROLE = "debugger"


def verdict_text(verdict: dict) -> str:
    """What the model is shown of a failed verdict: kind, detail, resources, errors, variants."""
    if verdict.get("report"):           # the guard's own report (custom drafts)
        return verdict["report"]
    corr = verdict.get("correctness") or {}
    parts = [f"failed at {verdict.get('stage')}: {verdict.get('kind')}: {(verdict.get('detail') or '')[:1500]}"]
    if verdict.get("resources"):
        parts.append("resources: " + json.dumps(verdict["resources"], default=str)[:1500])
    if corr:
        parts.append("correctness: " + json.dumps(corr, default=str)[:800])
    return "\n".join(parts)


def knob_fix(llm, space: dict, config: dict, verdict: dict, tried: set[str], facts: str,
             calls: list | None) -> tuple[Action, str] | None:
    """The model's one legal knob move for a failed template draft; None when it has none usable."""
    legal = {k: [v for v in vs if config_key({**config, k: v}) not in tried] for k, vs in space.items()}
    legal = {k: vs for k, vs in legal.items() if vs}
    if not legal:
        return None

    def check(reply: dict):
        knob, value = reply.get("knob"), reply.get("value")
        if knob not in legal or value not in legal[knob]:
            raise ValueError(f"{knob}={value!r} is not a legal untried move; legal: {json.dumps(legal)}")
        return Action(KNOB_KIND.get(knob, "tile"), knob, value), str(reply.get("why") or "the model's fix")

    user = (f"Return one knob move.\nVerdict:\n{verdict_text(verdict)}\n\nCurrent config: {json.dumps(config)}\n"
            f"Legal untried values: {json.dumps(legal)}\n{facts}")
    try:
        return ask_json(llm, prompt(ROLE), user, check, role=ROLE, calls=calls)
    except LLMFailure:
        return None


def custom_debug(state: State, runtime: Runtime[Context]) -> dict:
    """A rejected custom draft: one fix instruction for the coder node (origin "debugger")."""
    cand = state["candidate"]
    verdict = cand["verdict"]
    if verdict.get("kind") == "no code":
        instruction, fix = ("Your last reply held no ```python code block. Return the whole file in one "
                            "```python block, nothing else."), "ask_again"
        reason = "the reply held no code: asked again for the file (the deterministic fix)"
    else:
        instruction = (f"Return the fixed file. The verifier rejected this draft:\n{verdict_text(verdict)}\n"
                       "Change only what makes it pass.")
        fix, reason = "rewrite", f"{verdict.get('kind')}: the model rewrites the draft from the verdict"
    record = step_record(state, f"failed ({verdict.get('kind')}: {(verdict.get('detail') or '')[:200]}); "
                                f"debugger: {fix}")
    decision = {"action": {"kind": "fix", "knob": "fix", "value": fix}, "origin": "debugger",
                "alternatives": [], "reason": reason, "instruction": instruction,
                "role": "coder" if verdict.get("kind") == "no code" else ROLE}
    emit(E.Debug(step=cand["step"], fix=fix, reason=reason))
    emit(E.build("step", **record))
    return {"decision": decision, "debug_attempts": state.get("debug_attempts", 0) + 1,
            "steps": state.get("steps", []) + [record]}


def route_after_debug(state: State, runtime: Runtime[Context]) -> str:
    return "custom_code" if state.get("debug_attempts", 0) <= runtime.context.max_debug else "rollback"
