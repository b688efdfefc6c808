"""The memory facade: add a finished history, get it back, search and rank similar ones.

Writes go to the log first (under its lock), then to the index; a writer killed between the two
leaves the index behind, and the next add (or `rebuild`) indexes what it missed.  Reads of whole
records always come from the log.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from mtmc.kernels.spec import DTYPE_ALIASES
from mtmc.memory.index import HistoryIndex, MemoryUnavailable, shared_index
from mtmc.memory.log import HistoryLog
from mtmc.memory.records import HistoryRecord, describe_spec, shape_bucket, shape_distance
from mtmc.tools.paths import home

# similar() scores: shape distance (log2 units) + these penalties + the embedding's cosine
# distance, so a dtype change weighs like a 2x shape gap and another op like 4x.
DTYPE_PENALTY = 1.0
OP_PENALTY = 2.0
BUCKET_SPAN = 3     # first look within 8x of the element count, then anywhere in the family
POOL = 50           # nearest shapes whose descriptions are compared by embedding


class Store:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root else home() / "memory"
        self.log = HistoryLog(self.root / "histories.jsonl")
        self.index_note: str | None = None  # why the last add (or similar) did without the index

    def index(self) -> HistoryIndex:
        """The Chroma index, current with the log; MemoryUnavailable where it cannot be opened."""
        index = shared_index(self.root / "chroma")
        index.sync(self.log.size())
        return index

    # -- writing ---------------------------------------------------------------------------
    def add(self, record: HistoryRecord) -> str:
        """Append to the log (durable on return), then index; `index_note` says why a record
        is in the log only (the index is rebuildable, so its failure does not fail the add)."""
        self._append_all([record.to_dict()])
        return record.id

    def merge(self, records: list[dict]) -> int:
        """Append the records (as another log holds them: another host's, in a cluster run) whose
        ids this log lacks, and index them; returns how many.  Under the log's lock, so merging
        twice, or beside a writer, adds each history once."""
        return self._append_all(records, only_new=True)

    def _append_all(self, records: list[dict], only_new: bool = False) -> int:
        self.index_note = None
        with self.log.writing() as append:
            try:
                index = self.index()
            except MemoryUnavailable as exc:
                index, self.index_note = None, str(exc)
            have = self.log.records() if only_new else {}
            new = [r for r in records if r.get("id") not in have]
            for r in new:
                append(r)
            if index is not None:
                try:
                    missing = set(self.log.records()) - set(index.ids())
                    index.upsert([r for r in self.records() if r.id in missing])
                    index.log_size = self.log.size()
                except Exception as exc:  # any Chroma failure: the log has it, rebuild restores the index
                    self.index_note = f"indexing failed: {type(exc).__name__}: {exc}"
        return len(new)

    def rebuild(self) -> int:
        """Drop the index and index every record of the log again; returns how many."""
        with self.log.writing():
            index = self.index()
            index.reset()
            records = self.records()
            index.upsert(records)
            index.log_size = self.log.size()
        return len(records)

    # -- reading ---------------------------------------------------------------------------
    def records(self) -> list[HistoryRecord]:
        return [HistoryRecord.from_dict(d) for d in self.log.records().values()]

    def get(self, record_id: str) -> HistoryRecord | None:
        """By id, or by a prefix that names exactly one record."""
        recs = self.log.records()
        if record_id in recs:
            return HistoryRecord.from_dict(recs[record_id])
        hits = [d for k, d in recs.items() if k.startswith(record_id)]
        return HistoryRecord.from_dict(hits[0]) if len(hits) == 1 else None

    def search(self, text: str, op: str | None = None, gpu: str | None = None, k: int = 5) -> list[dict]:
        """Histories whose description is nearest to `text`; op matches a family or an op name.
        A dtype the text names ("fp16", "bf16", "half") weighs like in similar(): the words are
        put in the descriptions' terms (float16, ...) and another dtype adds DTYPE_PENALTY to the
        embedding's distance ("score" orders the hits)."""
        conds = []
        if op:
            conds.append({"$or": [{"family": op}, {"op": op}]})
        if gpu:
            conds.append({"gpu": gpu})
        index = self.index()
        text, dtypes = dtype_words(text)
        pool = max(k, POOL) if dtypes else k
        hits = self._summaries(index.query(text, _where(conds), min(pool, len(index.ids(_where(conds))))), gpu)
        for h in hits:
            h["score"] = round(h["distance"] + DTYPE_PENALTY * bool(dtypes and h["dtype"] not in dtypes), 4)
        return sorted(hits, key=lambda h: h["score"])[:k]

    def similar(self, spec: dict, gpu: str, k: int = 3) -> list[dict]:
        """Past histories for the same op family on the same GPU, nearest spec first.  Metadata
        filters select the family, GPU and size class; the shape distance computed from the
        metadata keeps the POOL nearest shapes (so the nearest is never lost); the embedding of
        the spec's description adds its distance; the sum orders them.  Where Chroma cannot be
        used (not installed, as on a bare GPU box; server down) the structured distance alone
        ranks the log's records, and each hit says so ("distance": None)."""
        try:
            return self._similar_from_index(self.index(), spec, gpu, k)
        except MemoryUnavailable as exc:
            self.index_note = str(exc)
        except Exception as exc:   # an index that fails mid-query must not stop the run: the log still ranks
            self.index_note = f"the Chroma index failed ({type(exc).__name__}: {exc})"
        return self._similar_from_log(spec, gpu, k)

    def _similar_from_index(self, index: HistoryIndex, spec: dict, gpu: str, k: int) -> list[dict]:
        base = [{"family": spec["family"]}, {"gpu": gpu}]
        bucket = shape_bucket(spec["dims"])
        near = base + [{"shape_bucket": {"$gte": bucket - BUCKET_SPAN}},
                       {"shape_bucket": {"$lte": bucket + BUCKET_SPAN}}]
        candidates = index.metadatas(_where(near))
        if len(candidates) < k:
            candidates = index.metadatas(_where(base))
        if not candidates:  # nothing to rank: no embedding (and no model load) needed
            return []
        structured = {i: _structured(spec, m) for i, m in candidates.items()}
        pool = sorted(structured, key=structured.get)[:POOL]
        hits = index.query(describe_spec(spec), None, len(pool), ids=pool)
        ranked = sorted(hits, key=lambda h: structured[h[0]] + h[1])[:k]
        return [{**s, "score": round(structured[s["id"]] + s["distance"], 4)} for s in self._summaries(ranked, gpu)]

    def _similar_from_log(self, spec: dict, gpu: str, k: int) -> list[dict]:
        metas = {r.id: r.metadata() for r in self.records()}
        structured = {i: _structured(spec, m) for i, m in metas.items()
                      if m["family"] == spec["family"] and m["gpu"] == gpu}
        ranked = sorted(structured, key=structured.get)[:k]
        return [{**self.get(i).summary(gpu), "distance": None, "score": round(structured[i], 4)} for i in ranked]

    def _summaries(self, hits: list[tuple[str, float]], gpu: str | None) -> list[dict]:
        out = []
        for record_id, distance in hits:
            rec = self.get(record_id)
            if rec is not None:  # an index entry always has its record; skip rather than fail if not
                out.append({**rec.summary(gpu), "distance": round(float(distance), 4)})
        return out


_DTYPE_WORD = re.compile(r"\b(" + "|".join(sorted(map(re.escape, DTYPE_ALIASES), key=len, reverse=True)) + r")\b", re.I)


def dtype_words(text: str) -> tuple[str, set[str]]:
    """(`text` with each dtype word in the descriptions' terms, the dtypes it names)."""
    named: set[str] = set()

    def canonical(m: re.Match) -> str:
        named.add(DTYPE_ALIASES[m.group(1).lower()])
        return DTYPE_ALIASES[m.group(1).lower()]
    return _DTYPE_WORD.sub(canonical, text), named


def _where(conds: list[dict]) -> dict | None:
    if not conds:
        return None
    return conds[0] if len(conds) == 1 else {"$and": conds}


def _structured(spec: dict, meta: dict) -> float:
    """The structured part of the distance, from a history's index metadata."""
    return (shape_distance(spec["dims"], json.loads(meta["dims"]))
            + DTYPE_PENALTY * (meta["dtype"] != spec.get("dtype", "float32"))
            + OP_PENALTY * (meta["op"] != spec["op"]))
