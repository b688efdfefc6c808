"""The Chroma index over the history log: one document per record (its description, embedded
locally) with flat metadata for filters.  It holds no data the log lacks, so it can be dropped
and rebuilt at any time.

Local by default (a PersistentClient in the data directory); a Chroma server when
MTMC_CHROMA_HOST is set ("host" or "host:port"; the port may also come from MTMC_CHROMA_PORT).
chromadb is imported here only when an index is opened: the core runs without it.
"""
from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

from mtmc.memory.records import HistoryRecord

COLLECTION = "mtmc_histories"


class MemoryUnavailable(RuntimeError):
    """The index cannot be used here (chromadb missing, server unreachable); the log still works."""


def open_client(path: Path):
    try:
        import chromadb
    except ImportError as exc:
        raise MemoryUnavailable(f"chromadb is not installed ({exc}); histories go to the log only") from exc
    settings = chromadb.Settings(anonymized_telemetry=False)
    host = os.environ.get("MTMC_CHROMA_HOST")
    try:
        if host:
            host, _, port = host.partition(":")
            port = int(port or os.environ.get("MTMC_CHROMA_PORT") or 8000)
            return chromadb.HttpClient(host=host, port=port, settings=settings)
        return chromadb.PersistentClient(path=str(path), settings=settings)
    except Exception as exc:  # connection refused, unreadable directory: say where, keep the log
        where = f"server {host}:{port}" if host else f"directory {path}"
        raise MemoryUnavailable(f"cannot open the Chroma index at {where}: {exc}") from exc


_SHARED: dict[tuple, "HistoryIndex"] = {}
# One lock for every index in the process: a module's groups are optimized in threads side by
# side, and Chroma's local client is not safe across them (two threads opening one directory, or
# a reopen closing the client under another thread's query, raised "'RustBindingsAPI' object has
# no attribute 'bindings'" and stopped the run).
_LOCK = threading.RLock()


def _locked(method):
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with _LOCK:
            return method(self, *args, **kwargs)
    return run


def shared_index(path: Path) -> "HistoryIndex":
    """One index per location and process: Chroma shares one system per directory in a process,
    so a reopen (see HistoryIndex.reopen) only works when nothing else holds it."""
    key = (str(path), os.environ.get("MTMC_CHROMA_HOST"), os.environ.get("MTMC_CHROMA_PORT"))
    with _LOCK:
        if key not in _SHARED:
            _SHARED[key] = HistoryIndex(path)
        return _SHARED[key]


class HistoryIndex:
    @_locked
    def __init__(self, path: Path):
        self.path = path
        self.client = open_client(path)  # MemoryUnavailable without chromadb, before importing it
        from mtmc.memory.embedding import MiniLMEmbedding  # registers it before any collection opens
        self.embedding = MiniLMEmbedding()
        try:
            self.collection = self._open()
        except Exception as exc:  # unreadable, or made with another embedding: runs go on without it
            raise MemoryUnavailable(f"cannot open collection {COLLECTION!r}: {exc}") from exc
        self.log_size = -1  # size of the log this process knows the index to reflect

    @_locked
    def sync(self, log_size: int) -> None:
        """See another process's writes when the log grew since this process last looked."""
        if self.log_size != log_size:
            if self.log_size >= 0:
                self.reopen()
            self.log_size = log_size

    @_locked
    def reopen(self) -> None:
        """A local index is read into memory when opened and does not see another process's
        later writes; opening it again does."""
        self.client.close()
        self.client = open_client(self.path)
        self.collection = self._open()

    def _open(self):
        return self.client.get_or_create_collection(
            COLLECTION, embedding_function=self.embedding, configuration={"hnsw": {"space": "cosine"}})

    @_locked
    def ids(self, where: dict | None = None) -> list[str]:
        return self.collection.get(where=where, include=[])["ids"]

    @_locked
    def metadatas(self, where: dict | None = None) -> dict[str, dict]:
        res = self.collection.get(where=where, include=["metadatas"])
        return dict(zip(res["ids"], res["metadatas"]))

    @_locked
    def upsert(self, records: list[HistoryRecord]) -> None:
        batch = self.client.get_max_batch_size()
        for i in range(0, len(records), batch):
            part = records[i:i + batch]
            self.collection.upsert(ids=[r.id for r in part], documents=[r.description() for r in part],
                                   metadatas=[r.metadata() for r in part])

    @_locked
    def query(self, text: str, where: dict | None, n: int, ids: list[str] | None = None) -> list[tuple[str, float]]:
        """(id, cosine distance) of the n nearest descriptions passing the filter (and among
        `ids` when given), nearest first."""
        from chromadb.errors import InternalError
        if n <= 0:
            return []
        args = dict(query_texts=[text], where=where, ids=ids, n_results=n, include=["distances"])
        try:
            res = self.collection.query(**args)
        except InternalError:  # "Error finding id": another process indexed more since the last open
            self.reopen()
            res = self.collection.query(**args)
        return list(zip(res["ids"][0], res["distances"][0]))

    @_locked
    def reset(self) -> None:
        from chromadb.errors import NotFoundError
        try:
            self.client.delete_collection(COLLECTION)
        except NotFoundError:  # another process dropped it first: nothing to drop
            pass
        self.collection = self._open()
