"""code node (micro): apply exactly one action to a draft and render the new source."""
from __future__ import annotations

import difflib

from langgraph.runtime import Runtime

from mtmc.agents import events as E
from mtmc.agents.context import Context
from mtmc.agents.stream import emit
from mtmc.agents.planner import history_used
from mtmc.agents.state import State
from mtmc.kernels.catalog import family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.policy.actions import Action
from mtmc.tools.hardware import resolve


def source_diff(old: str, new: str) -> str:
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), "before.py", "after.py", lineterm="", n=1)
    return "\n".join(lines)


WARM_DIM_RATIO = 2.0   # a past spec's dims may differ by this factor each and still lend its config


def warm_start(retrieved: list[dict], space: dict[str, list], gpu: str, spec: dict | None = None) -> dict | None:
    """The nearest retrieved history on this GPU whose final config is legal for this spec and
    worth starting from: the same op and dtype, every dim within WARM_DIM_RATIO of this spec's,
    and not a draft that lost to eager.  (L2 57 on the H100: a conv with 8 input channels started
    from the config of one with 64, 3.7x slower than the template's default for it.)"""
    for h in retrieved:
        cfg = h.get("final_config") or {}
        if h.get("gpu") != gpu or set(cfg) != set(space) or not all(cfg[k] in space[k] for k in space):
            continue
        if spec is not None and not _close(spec, h):
            continue
        if (h.get("speedups") or {}).get("eager", 1.0) < 1.0:
            continue
        return h
    return None


def _close(spec: dict, h: dict) -> bool:
    dims, theirs = spec.get("dims") or {}, h.get("dims") or {}
    if h.get("op") != spec.get("op") or h.get("dtype") != spec.get("dtype") or set(dims) != set(theirs):
        return False
    return all(max(dims[k], theirs[k]) <= WARM_DIM_RATIO * max(1, min(dims[k], theirs[k])) for k in dims)


def _memory_reason(h: dict) -> str:
    ms = h.get("time_ms")
    how = "no time" if ms is None else f"{'measured' if h.get('measured') else 'estimated'} {ms:.4f} ms"
    trust = (f"stale ({'; '.join(h['stale_reasons'])}), so it is re-verified before it is trusted"
             if h.get("stale") else "re-verified here like any draft")
    return (f"first draft: the final config of history {h['id']} ({h['description']} on {h['gpu']}, "
            f"reached at step {h['final_step']}, {how}); {trust}")


def first_draft(state: State, runtime: Runtime[Context]) -> dict:
    """Step 0: a given config, else the best config of the nearest past history on this GPU
    (memory warm start), else the family's template at its default config."""
    spec = KernelSpec.from_dict(state["spec"])
    family = family_of(spec)
    hw = resolve(runtime.context.target)
    given = state.get("initial_config")
    warm = None if given else warm_start(state.get("retrieved") or [], family.config_space(spec), hw.name,
                                         spec.to_dict())
    if given:
        config, origin = dict(given), "given"
        reason = f"first draft: the {family.name} template at its given config"
    elif warm:
        config, origin, reason = dict(warm["final_config"]), "memory", _memory_reason(warm)
    else:
        config, origin = dict(family.default_config(spec, hw)), "template"
        reason = f"first draft: the {family.name} template at its default config"
    source = family.render(spec, config)
    decision = {"action": {"kind": "init", "knob": None, "value": None}, "origin": origin, "reason": reason,
                "alternatives": [], "history": history_used(state, warm["id"] if warm else None)}
    emit(E.Code(step=0, config=config, diff="", origin=origin, history=decision["history"]))
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
    emit(E.Code(step=step, config=config, diff=diff, origin=decision.get("origin")))
    return {"candidate": {"config": config, "source": source, "step": step, "diff": diff}}
