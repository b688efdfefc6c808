"""`mtmc optimize DIR --out OUTDIR [--workers N | --scheduler ADDR]`: every module file below DIR,
one task each, on a Dask cluster (mtmc.tools.cluster) or one after another in this process.

Per module REL.py: OUTDIR/REL.py (the original plus ModelNew, as `mtmc optimize` writes it),
REL.md (its report) and REL.log (its progress lines); OUTDIR/batch.jsonl gets one line per module
as it finishes.  A re-run skips the modules recorded there with the same content (sha256) unless
--redo.  A task gets the module's text and hands back the files' texts, so only this process
writes into OUTDIR, whichever host ran the task.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tempfile
import time
from pathlib import Path

from mtmc.agents.context import Context
from mtmc.agents.events.text import printer
from mtmc.agents.module_flow import optimize_module
from mtmc.commands import known_target
from mtmc.memory.shared import merge_from_workers
from mtmc.tools.cluster import Done, open_engine

RECORDS = "batch.jsonl"


def find_modules(folder: Path) -> list[str]:
    """The module files below `folder` (relative paths), skipping packages' __init__ and
    private helpers (a leading underscore)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.py")
                  if not p.name.startswith("_") and not any(part.startswith(".") for part in p.parts))


def optimize_text(name: str, source: str, target: str, max_steps: int, timeout_s: float) -> dict:
    """One module, optimized in this process (a worker): its summary, seconds, and the texts of
    ModelNew's file, the report and the progress log (None where not written)."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mtmc-batch-") as tmp:
        path, out, report = Path(tmp) / name, Path(tmp) / "out" / name, Path(tmp) / "report.md"
        path.write_text(source)
        out.parent.mkdir()
        log = io.StringIO()
        ctx = Context(target=target, max_steps=max_steps, timeout_s=timeout_s)
        summary = optimize_module(str(path), ctx, str(out), str(report), on_event=printer(log))
        read = lambda p: p.read_text() if p.exists() else None
        return {"summary": {k: v for k, v in summary.items() if k != "report"}, "new": read(out),
                "report": read(report), "log": log.getvalue(), "seconds": round(time.monotonic() - start, 1)}


def _line(rel: str, sha: str, got: dict) -> dict:
    s = got["summary"]
    groups = s.get("groups") or []
    return {"module": rel, "sha256": sha, "status": s.get("status"), "groups": len(groups),
            "kernels": sum(g.get("status") == "kernel" for g in groups),
            "check": (s.get("check") or {}).get("status"),
            "message": None if s.get("status") == "done" else (s.get("message") or "")[:500] or None,
            "seconds": got["seconds"]}


def _recorded(path: Path) -> dict[str, dict]:
    out = {}
    if path.exists():
        for text in path.read_text().splitlines():
            try:
                line = json.loads(text)
            except ValueError:   # cut short by a killed run
                continue
            out[line.get("module")] = line
    return out


def run_batch(args, engine=None) -> int:
    """engine: an open cluster to use (else the one --workers / --scheduler ask for, if any)."""
    folder, out = Path(args.model), Path(args.out or "")
    if not args.out:
        print("mtmc optimize DIR: --out OUTDIR is required (the folder for the ModelNew files)")
        return 2
    if not known_target(args.target):
        return 2
    records = out / RECORDS
    done = _recorded(records)
    sources = {rel: (folder / rel).read_text() for rel in find_modules(folder)}
    sha = {rel: hashlib.sha256(text.encode()).hexdigest() for rel, text in sources.items()}
    todo = [rel for rel in sources if args.redo or (done.get(rel) or {}).get("sha256") != sha[rel]]
    print(f"{len(sources)} module(s) in {folder}; {len(sources) - len(todo)} already recorded in {records}; "
          f"{len(todo)} to optimize", flush=True)
    items = [(rel, (Path(rel).name, sources[rel], args.target, args.max_steps, args.timeout)) for rel in todo]
    lost = 0
    with _given(engine) if engine else open_engine(args) as engine:
        results = engine.map(optimize_text, items) if engine else _in_process(items)
        for i, got in enumerate(results, 1):
            if got.error:
                lost += 1
                print(f"[{i}/{len(todo)}] {got.key}: lost on all {got.attempts} tries ({got.error}); not recorded, "
                      f"a re-run tries it again", flush=True)
                continue
            line = {**_line(got.key, sha[got.key], got.result), "worker": got.worker, "attempts": got.attempts}
            _write(out, got.key, got.result)
            records.parent.mkdir(parents=True, exist_ok=True)
            with open(records, "a") as f:
                f.write(json.dumps(line) + "\n")
            kernels = f", {line['kernels']}/{line['groups']} groups with a kernel" if line["groups"] else ""
            check = f", check {line['check']}" if line["check"] else ""
            why = f": {line['message'].splitlines()[0][:160]}" if line["message"] and line["status"] != "done" else ""
            print(f"[{i}/{len(todo)}] {got.key}: {line['status']}{kernels}{check}{why} ({line['seconds']:.0f} s)",
                  flush=True)
        if engine:
            merged = merge_from_workers(engine)
            if merged:
                print(f"memory: {merged} histories from other hosts' logs merged into this one", flush=True)
    print(f"records: {records}")
    return 1 if lost else 0


@contextlib.contextmanager
def _given(engine):
    yield engine   # the caller's engine: it closes it


def _in_process(items):
    """The tasks one after another here, as Done like the engine's (a crash loses only its module)."""
    for key, args in items:
        try:
            yield Done(key, optimize_text(*args))
        except Exception as exc:
            yield Done(key, None, f"{type(exc).__name__}: {exc}")


def _write(out: Path, rel: str, got: dict) -> None:
    target = out / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".py", got["new"]), (".md", got["report"]), (".log", got["log"])):
        if text is not None:
            target.with_suffix(suffix).write_text(text)
