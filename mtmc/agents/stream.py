"""Progress events out of a graph node: one of mtmc.agents.events' dataclasses, written as its dict to
LangGraph's custom stream (what `run_request(on_event=...)` and the module graph pass on)."""
from __future__ import annotations

from mtmc.agents.events import Event


def emit(event: Event) -> None:
    """Send one event to whoever streams the run ("custom" stream mode); a no-op outside a run."""
    try:
        from langgraph.config import get_stream_writer
        writer = get_stream_writer()
    except Exception:
        return
    writer(event.to_dict())
