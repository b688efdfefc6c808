"""Memory of optimization histories: an append-only JSONL log (the truth) indexed in Chroma.

Importing this package does not import chromadb; opening the index does, and raises
MemoryUnavailable where it cannot (then histories still go to the log).
"""
from mtmc.memory.index import MemoryUnavailable
from mtmc.memory.records import HistoryRecord, current_versions, new_id, now_iso
from mtmc.memory.store import Store

__all__ = ["HistoryRecord", "MemoryUnavailable", "Store", "current_versions", "new_id", "now_iso"]
