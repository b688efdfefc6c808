"""The planner role with a model (issue 18): the learned policy ranks the legal moves and stays in
charge of legality; with a model configured, the model picks one of the policy's top moves (or
stop) and says why (prompts/planner.md).  A reply naming anything else, or none at all, leaves
the policy's own choice, with a note; a dead endpoint never stops the run."""
from __future__ import annotations

from mtmc.agents.llm_coder import hardware_facts
from mtmc.kernels.catalog import describe, family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.policy.actions import STOP, Action, legal_actions
from mtmc.tools.llm import LLMFailure, ask_json, prompt

ROLE = "planner"


def _moves(decision: dict) -> list[str]:
    return [a["action"] for a in decision.get("alternatives") or []]


def _user_message(spec: KernelSpec, config: dict, decision: dict, current_ms: float | None, target) -> str:
    lines = [f"Kernel: {describe(spec)}", f"Current config: {config}",
             f"Current time: {f'{current_ms:.4f} ms measured' if current_ms else 'not measured (no GPU)'}",
             hardware_facts(target), "Ranked legal moves (the policy's probability; predicted ms is an estimate):"]
    for a in decision["alternatives"]:
        ms = a.get("predicted_ms")
        lines.append(f"- {a['action']}: p={a.get('prob', 0):.2f}" + (f", predicted {ms:.4f} ms" if ms else ""))
    return "\n".join(lines)


def choose(llm, spec: KernelSpec, config: dict, decision: dict, current_ms: float | None, target,
           calls: list | None = None) -> dict:
    """The decision with the model's pick among its alternatives (`chosen_by`: "model"), or the
    policy's decision with a `model_note` saying why the model's answer was not used."""
    labels = _moves(decision)
    legal = {a.label(): a for a in legal_actions(family_of(spec).config_space(spec), config)}
    legal[STOP.label()] = STOP

    def check(reply: dict) -> tuple[str, str]:
        choice = str(reply.get("choice", "")).strip()
        if choice not in labels or choice not in legal:
            raise ValueError(f"'choice' must be one of the listed moves ({', '.join(labels)}), not {choice!r}")
        return choice, str(reply.get("why", "")).strip()[:400]
    try:
        choice, why = ask_json(llm, prompt(ROLE), _user_message(spec, config, decision, current_ms, target), check,
                               role=ROLE, calls=calls)
    except LLMFailure as exc:
        return {**decision, "model_note": f"the model's pick was not used ({exc}); the policy's choice stands"}
    if choice == Action.from_dict(decision["action"]).label():
        return {**decision, "chosen_by": "model", "model_why": why,
                "reason": f"{decision['reason']}; the model agrees: {why}"}
    return {**decision, "action": legal[choice].to_dict(), "chosen_by": "model", "model_why": why,
            "reason": f"{choice}: the model's choice among the policy's top {len(labels)} legal moves: {why} "
                      f"(the policy's own: {decision['reason']})"}
