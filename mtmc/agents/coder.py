"""code node (micro): apply exactly one action to a draft and render the new source."""
from __future__ import annotations

import difflib

from langgraph.runtime import Runtime

from mtmc.agents.context import Context
from mtmc.agents.events import emit
from mtmc.agents.state import State
from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.policy.actions import Action
from mtmc.tools.hardware import resolve


def source_diff(old: str, new: str) -> str:
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), "before.py", "after.py", lineterm="", n=1)
    return "\n".join(lines)


def first_draft(state: State, runtime: Runtime[Context]) -> dict:
    """Step 0: the family's template at its default config (or a given starting config)."""
    spec = KernelSpec.from_dict(state["spec"])
    family = family_of(spec)
    config = dict(state.get("initial_config") or family.default_config(spec, resolve(runtime.context.target)))
    origin = "given" if state.get("initial_config") else "template"
    source = family.render(spec, config)
    decision = {"action": {"kind": "init", "knob": None, "value": None}, "origin": origin,
                "reason": f"first draft: the {family.name} template at its {'given' if origin == 'given' else 'default'} config",
                "alternatives": []}
    emit("code", step=0, config=config, diff="", origin=origin)
    return {"candidate": {"config": config, "source": source, "step": 0}, "decision": decision,
            "best": {}, "debug_attempts": 0, "stale_steps": 0}


def code(state: State, runtime: Runtime[Context]) -> dict:
    """Apply state["decision"]'s action to the draft it was made for."""
    spec = KernelSpec.from_dict(state["spec"])
    decision = state["decision"]
    base = state["candidate"] if decision.get("origin") == "debugger" else state["best"]
    action = Action.from_dict(decision["action"])
    config = action.apply(base["config"])
    source = family_of(spec).render(spec, config)
    step = len(state.get("steps", []))
    diff = source_diff(base["source"], source)
    emit("code", step=step, config=config, diff=diff, origin=decision.get("origin"))
    return {"candidate": {"config": config, "source": source, "step": step, "diff": diff}}
