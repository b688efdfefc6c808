"""parse and retrieve nodes: words -> KernelSpec, then similar past histories."""
from __future__ import annotations

from langgraph.runtime import Runtime

from mtmc.agents.context import Context
from mtmc.agents.events import emit
from mtmc.agents.state import State
from mtmc.kernels.catalog import family_of
from mtmc.kernels.parse import parse_request
from mtmc.kernels.spec import KernelSpec


def parse(state: State, runtime: Runtime[Context]) -> dict:
    if state.get("spec"):  # a spec given directly (module groups, tests): validate it only
        spec = KernelSpec.from_dict(state["spec"])
        try:
            family_of(spec).validate(spec)
        except ValueError as exc:
            emit("unsupported", message=str(exc))
            return {"status": "unsupported", "message": str(exc)}
        emit("parsed", spec=spec.to_dict(), description=spec.describe(), assumptions=[])
        return {"status": "running", "assumptions": [], "spec": spec.to_dict()}
    result = parse_request(state["request"])
    if not result.ok:
        emit("unsupported", message=result.message)
        return {"status": "unsupported", "message": result.message}
    spec = result.spec
    emit("parsed", spec=spec.to_dict(), description=spec.describe(), assumptions=result.assumptions)
    return {"status": "running", "spec": spec.to_dict(), "assumptions": list(result.assumptions)}


def retrieve(state: State, runtime: Runtime[Context]) -> dict:
    """Similar past optimizations; the memory store plugs in here (empty until it lands)."""
    retrieved: list[dict] = []
    emit("retrieved", count=len(retrieved))
    return {"retrieved": retrieved}
