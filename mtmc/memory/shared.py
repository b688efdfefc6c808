"""One history for a whole cluster run.  Workers on this host append to this host's log (its
flock keeps the lines whole), and with --chroma every worker indexes into one Chroma server;
the log stays the truth, so what workers on other hosts wrote to their own logs is merged into
this host's log by id after the run (merging is idempotent)."""
from __future__ import annotations

from mtmc.memory.store import Store


def worker_records(known: list[str]) -> list[dict]:
    """In a worker: its host's histories whose ids are not in `known`."""
    known_ids = set(known)
    return [r for i, r in Store().log.records().items() if i not in known_ids]


def merge_from_workers(engine) -> int:
    """Merge every worker host's new histories into this host's log (and index); how many."""
    store = Store()
    known = sorted(store.log.records())
    found: dict[str, dict] = {}
    for records in engine.run_everywhere(worker_records, known).values():
        for r in records or []:
            found.setdefault(r["id"], r)
    return store.merge(list(found.values())) if found else 0
