"""The history tab: search past optimizations in memory and open one (its steps and kernel)."""
from __future__ import annotations

import pandas as pd

from mtmc.ui import services
from mtmc.ui.steps import messages_from_state

COLUMNS = ["id", "when", "what", "GPU", "time (ms)", "timing", "drafts"]


def search(query: str) -> tuple[pd.DataFrame, list[str], str]:
    """(table rows, ids to open, a note for people)."""
    try:
        hits = services.search_history(query or "")
    except services.Unavailable as exc:
        return pd.DataFrame(columns=COLUMNS), [], f"Memory is not available: {exc}"
    rows = [[h.get("id"), (h.get("created") or "")[:19].replace("T", " "), h.get("description") or h.get("request"),
             h.get("gpu"), _ms(h.get("time_ms")), "measured" if h.get("measured") else "estimate, no GPU",
             h.get("drafts")] for h in hits]
    note = f"{len(rows)} past optimization{'s' if len(rows) != 1 else ''}" + (f" near '{query}'" if query else "")
    return pd.DataFrame(rows, columns=COLUMNS), [r[0] for r in rows], note


def open_record(record_id: str | None) -> tuple[list[dict], str]:
    """(the run as chat messages, its kernel source)."""
    if not record_id:
        return [], ""
    try:
        state = services.history_state(record_id)
    except services.Unavailable as exc:
        return [{"role": "assistant", "content": str(exc)}], ""
    return messages_from_state(state), (state.get("best") or {}).get("source", "")


def _ms(v) -> float | None:
    return round(float(v), 5) if isinstance(v, (int, float)) else None
