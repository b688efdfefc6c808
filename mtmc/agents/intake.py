"""parse and retrieve nodes: words -> KernelSpec, then similar past histories."""
from __future__ import annotations

from langgraph.runtime import Runtime

from mtmc.agents import events as E
from mtmc.agents.context import Context
from mtmc.agents.stream import emit
from mtmc.agents.state import State
from mtmc.kernels.catalog import describe, family_of
from mtmc.kernels.spec import KernelSpec
from mtmc.memory import Store
from mtmc.request.llm_parse import read_request
from mtmc.tools.hardware import resolve
from mtmc.tools.machine import gib


def check_fits(spec: KernelSpec, target: str | None) -> None:
    """ValueError, with the numbers, when the kernel's inputs and output cannot be held in the
    target GPU's memory at once: such a request is refused, never estimated."""
    profile = resolve(target)
    need = family_of(spec).tensor_bytes(spec)
    if profile.memory_bytes and need > profile.memory_bytes:
        raise ValueError(f"{describe(spec)} does not fit the target GPU: its inputs and output need {gib(need)} "
                         f"({need:,} bytes), and the {profile.name} has {gib(profile.memory_bytes)} "
                         f"({profile.memory_bytes:,} bytes) of memory. Ask for a smaller shape.")


def parse(state: State, runtime: Runtime[Context]) -> dict:
    if state.get("spec"):  # a spec given directly (module groups, tests): validate it only
        spec = KernelSpec.from_dict(state["spec"])
        try:
            family_of(spec).validate(spec)
            check_fits(spec, runtime.context.target)
        except ValueError as exc:
            emit(E.Unsupported(message=str(exc)))
            return {"status": "unsupported", "message": str(exc)}
        emit(E.Parsed(spec=spec.to_dict(), description=describe(spec), assumptions=[]))
        return {"status": "running", "assumptions": [], "spec": spec.to_dict()}
    calls: list[dict] = []     # the model's calls (role, latency, tokens), kept in the history
    result, custom = read_request(state["request"], runtime.context.llm, calls)
    if custom is not None:   # outside the catalog, with a model to write it: the graph's custom branch
        c = {"name": custom.name, "reference": custom.reference, "inputs": custom.inputs}
        emit(E.Parsed(spec={"custom": c}, description=f"{custom.name} (outside the catalog)",
                      assumptions=list(result.assumptions)))
        return {"status": "running", "custom": c, "assumptions": list(result.assumptions), "llm_calls": calls}
    if not result.ok:
        emit(E.Unsupported(message=result.message))
        return {"status": "unsupported", "message": result.message, "llm_calls": calls}
    spec = result.spec
    try:
        check_fits(spec, runtime.context.target)
    except ValueError as exc:
        emit(E.Unsupported(message=str(exc)))
        return {"status": "unsupported", "message": str(exc)}
    emit(E.Parsed(spec=spec.to_dict(), description=describe(spec), assumptions=list(result.assumptions)))
    other = {"alternative": result.alternative.to_dict()} if result.alternative else {}
    return {"status": "running", "spec": spec.to_dict(), "assumptions": list(result.assumptions), "llm_calls": calls,
            **other}


def retrieve(state: State, runtime: Runtime[Context]) -> dict:
    """Similar past optimizations on the target GPU, nearest spec first (light summaries)."""
    gpu = resolve(runtime.context.target).name
    store = Store()
    retrieved = store.similar(state["spec"], gpu, k=3)
    note = f"{len(retrieved)} similar past histories on {gpu}"
    if store.index_note:  # Chroma unusable here: the log was ranked by shape, dtype and op alone
        note += f" (from the log by shape, dtype and op; memory index unavailable: {store.index_note})"
    emit(E.Retrieved(count=len(retrieved), gpu=gpu, note=note,
                     histories=[{k: h[k] for k in ("id", "description", "final_config", "stale", "score")}
                                for h in retrieved]))
    return {"retrieved": retrieved}
