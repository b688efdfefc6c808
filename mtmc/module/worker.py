"""The module package's child process: `python -m mtmc.module.worker` serves tools.worker's jobs
plus "capture" (module.capture: import the upload, build Model, trace its forward), with
tools.worker's loop.  `run_job` runs one job in a sandboxed child of this entry."""
from __future__ import annotations

from mtmc.tools import sandbox, worker

ENTRY = "mtmc.module.worker"   # `python -m ENTRY`: this module


def _capture(job: dict) -> dict:
    from mtmc.module.capture import capture_job
    return capture_job(job)


HANDLERS = {**worker.HANDLERS, "capture": _capture}


def run_job(job: dict, timeout_s: float, **options) -> dict:
    """tools.sandbox.run_job of one of this entry's jobs (the options are run_job's)."""
    return sandbox.run_job(job, timeout_s, entry=ENTRY, **options)


if __name__ == "__main__":
    worker.main(HANDLERS)
