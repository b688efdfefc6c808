"""What each conversation ran last.  A kernel run lives in the graph's checkpointer under the
conversation's thread; a module run is many graph runs (one per fusion group, each stored in
memory), so it is noted here, next to the checkpointer, for the questions that follow it."""
from __future__ import annotations

import json
import re

from mtmc.tools.paths import home

_THREAD = re.compile(r"^[0-9a-f]{32}$")     # uuid4().hex: the only ids the chat hands out
_KEEP = ("file", "out", "status", "gpu", "groups", "torch_ops", "uncaptured", "check")


def valid_thread(thread_id: str | None) -> bool:
    return bool(thread_id and _THREAD.match(thread_id))


def _path(thread_id: str):
    if not valid_thread(thread_id):
        raise ValueError(f"not a conversation id: {thread_id!r}")
    folder = home() / "conversations"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{thread_id}.json"


def note_kernel_run(thread_id: str) -> None:
    _path(thread_id).write_text(json.dumps({"kind": "kernel"}))


def note_module_run(thread_id: str, summary: dict, histories: dict[int, str]) -> None:
    note = {"kind": "module", "summary": {k: summary.get(k) for k in _KEEP},
            "histories": {str(k): v for k, v in histories.items()}}
    _path(thread_id).write_text(json.dumps(note, default=str))


def last_run(thread_id: str | None) -> dict:
    """{"kind": "kernel"}, {"kind": "module", "summary": ..., "histories": {group: id}}, or {}."""
    if not valid_thread(thread_id):
        return {}
    path = _path(thread_id)
    return json.loads(path.read_text()) if path.exists() else {}
