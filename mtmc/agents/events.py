"""Progress events: nodes report what they do as it happens (LangGraph's custom stream)."""
from __future__ import annotations


def emit(kind: str, **data) -> None:
    """Send one event to whoever streams the run ("custom" stream mode); a no-op outside a run."""
    try:
        from langgraph.config import get_stream_writer
        writer = get_stream_writer()
    except Exception:
        return
    writer({"event": kind, **data})
