"""The append-only history log (JSON lines): the memory's source of truth.

One writer at a time holds an exclusive flock on the file for the whole write; each record is
one line, fsynced before the lock is released.  A writer killed mid-write leaves an unterminated
last line: readers never consume a line without its newline, and the next writer cuts it off
before appending, so a crash loses at most the record being written.
"""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_CHUNK = 1 << 16


class HistoryLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._pos = 0                        # bytes consumed so far (always at a line start)
        self._records: dict[str, dict] = {}  # id -> record, in log order

    # -- writing ---------------------------------------------------------------------------
    @contextmanager
    def writing(self) -> Iterator[Callable[[dict], None]]:
        """Hold the writer lock; yields append(record).  Other writers wait; readers do not."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if created:  # make the new file's name durable too
                _fsync_dir(self.path.parent)
            _cut_torn_tail(fd)
            yield lambda record: _append(fd, record)
        finally:
            os.close(fd)  # releases the lock

    def append(self, record: dict) -> None:
        with self.writing() as append:
            append(record)

    # -- reading ---------------------------------------------------------------------------
    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def records(self) -> dict[str, dict]:
        """Every complete record, by id, in log order (re-reads only what was appended)."""
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self._pos:  # replaced or cut below us: start over
                    self._pos, self._records = 0, {}
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return self._records
        end = data.rfind(b"\n") + 1  # an unterminated tail is a write in progress or a torn one
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "id" in rec:
                self._records[rec["id"]] = rec
        self._pos += end
        return self._records


def _append(fd: int, record: dict) -> None:
    data = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def _cut_torn_tail(fd: int) -> None:
    """Drop a last line that a killed writer left without its newline."""
    size = end = os.fstat(fd).st_size
    if size == 0:
        return
    while end > 0:
        start = max(0, end - _CHUNK)
        chunk = os.pread(fd, end - start, start)
        if end == size and chunk.endswith(b"\n"):
            return
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            end = start + nl + 1
            break
        end = start
    os.ftruncate(fd, end)
    os.fsync(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
