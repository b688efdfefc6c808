"""Warm worker sessions for the drafts of the MTMC loop: torch, Triton and CUDA start once per
session instead of once per draft (a cold child cost 6-7 s a step on the H200).

Three kinds, one session each, each running one job at a time (a lock per kind: the GPU times one
draft at a time, so timings stay clean while other groups compile on the CPU):
  "gpu"      interpreter off, no memory cap (CUDA reserves far more than it uses): check + time
  "check"    Triton's interpreter on CPU tensors (no GPU)
  "compile"  interpreter off, the compile for the target GPU (tools.target_compile)
A session that timed out or crashed is gone; one whose CUDA context an error may have broken is
closed; either way the next job starts a fresh one.  Drafts come from the coder; the cheat-proof
guard checks the final ModelNew in fresh sessions of its own.
"""
from __future__ import annotations

import atexit
import re
import threading

from mtmc.tools.isolation import Confinement
from mtmc.tools.worker import Session

CPU_MEMORY_MB = 8192
# an error after which the process's CUDA context may be unusable
_BROKEN_CONTEXT = re.compile(r"illegal memory access|CUDA error|unspecified launch failure|misaligned address|"
                             r"device-side assert|AcceleratorError", re.I)
_KINDS = {"gpu": (False, None), "check": (True, CPU_MEMORY_MB), "compile": (False, CPU_MEMORY_MB)}


class WorkerPool:
    def __init__(self):
        self._sessions: dict[str, Session] = {}
        self._locks = {kind: threading.Lock() for kind in _KINDS}

    def run(self, kind: str, job: dict, timeout_s: float) -> dict:
        """One job in the warm session of `kind`; the result as tools.worker.run_job gives it."""
        with self._locks[kind]:
            session = self._sessions.get(kind)
            if session is None or not session.alive:
                interpret, memory_mb = _KINDS[kind]
                # drafts are our templates' code: isolated where possible, run plainly where not
                session = self._sessions[kind] = Session(interpret=interpret, memory_mb=memory_mb, name=f"draft-{kind}",
                                                         confine=Confinement(gpu=kind == "gpu"), untrusted=False)
            result = session.call(job, timeout_s)
            text = f"{result.get('error_type', '')} {result.get('message', '')}"
            if result["status"] == "error" and _BROKEN_CONTEXT.search(text):
                session.close()
            return result

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def drafts_pool() -> WorkerPool:
    """The process's pool (made on first use, closed at exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WorkerPool()
            atexit.register(_POOL.close)
        return _POOL
