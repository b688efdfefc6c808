"""`mtmc optimize MODEL.py --out NEW.py`: a faster drop-in ModelNew for an uploaded module;
`--plan-only`: only how it would be split (capture and partition, nothing compiled);
`mtmc optimize DIR --out OUTDIR [--workers N | --scheduler ADDR]`: every module file below DIR,
one task each, on a Dask cluster (mtmc.tools.cluster) or one after another in this process.

Per module REL.py: OUTDIR/REL.py (the original plus ModelNew, as `mtmc optimize` writes it),
REL.md (its report) and REL.log (its progress lines); OUTDIR/batch.jsonl gets one line per module
as it finishes.  A re-run skips the modules recorded there with the same content (sha256) unless
--redo.  A task gets the module's text and hands back the files' texts, so only this process
writes into OUTDIR, whichever host ran the task."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from mtmc.agents.context import Context, known_target
from mtmc.agents.events.text import printer
from mtmc.agents.module_flow import optimize_module, plan_module
from mtmc.memory.shared import merge_from_workers
from mtmc.tools import isolation
from mtmc.tools.cluster import Done, add_cluster_args, open_engine
from mtmc.tools.machine import gib


def print_plan(plan: dict, out) -> None:
    """The plan's closing lines (its groups and torch ops were printed as events)."""
    if plan["status"] != "planned":
        return
    m = plan["memory"]
    shapes = ", ".join("x".join(map(str, i["shape"])) + f" {i['dtype']}" for i in plan["inputs"] if i["kind"] == "tensor")
    print(f"inputs: {shapes or 'none'}; inputs {gib(m['inputs_bytes'])}, parameters {gib(m['params_bytes'])}, "
          f"outputs {gib(m['outputs_bytes'])}" + (f"; GPU free {gib(m['gpu_free_bytes'])}" if m["gpu_free_bytes"] else ""),
          file=out)
    how = "fake tensors (shapes only)" if plan["tensors"] == "fake" else "real tensors (fake ones could not run it)"
    print(f"{plan['file']}: planned in {plan['seconds']:.1f} s, captured on {how}", file=out)


def cmd_plan(args) -> int:
    log = sys.stderr if args.json else sys.stdout
    print(isolation.status().line(), file=sys.stderr)
    plan = plan_module(args.model, on_event=printer(log))
    print_plan(plan, log)
    if args.json:
        print(json.dumps(plan, indent=2, default=str))
    return 0 if plan["status"] == "planned" else 2


def cmd_optimize(args) -> int:
    if os.path.isdir(args.model) and not args.plan_only:
        return run_batch(args)
    if args.workers or args.scheduler:
        print("mtmc optimize: --workers / --scheduler spread a folder of modules (give a folder)", file=sys.stderr)
        return 2
    if args.plan_only:
        return cmd_plan(args)
    if not args.out:
        print("mtmc optimize: --out is required (or --plan-only)", file=sys.stderr)
        return 2
    if not known_target(args.target):
        return 2
    ctx = Context(target=args.target, max_steps=args.max_steps, timeout_s=args.timeout,
                  time_module=not args.no_time, budget_s=args.time_budget, cuda_graph=args.cuda_graph,
                  allow_tf32=args.allow_tf32)
    log = sys.stderr if args.json else sys.stdout
    print(isolation.status().line(), file=sys.stderr)
    summary = optimize_module(args.model, ctx, args.out, args.report, on_event=printer(log))
    if args.json:
        print(json.dumps({k: v for k, v in summary.items() if k != "report"}, indent=2, default=str))
    return {"done": 0, "rejected": 2}.get(summary["status"], 1)


def register(sub) -> None:
    p = sub.add_parser("optimize", help="write a faster drop-in ModelNew for a PyTorch module file")
    p.add_argument("model", help="a file with class Model(nn.Module), get_inputs() and get_init_inputs(); or a "
                   "folder of them (each optimized as one task, on a Dask cluster with --workers / --scheduler)")
    p.add_argument("--out", help="path of the file to write (the original plus ModelNew); required unless --plan-only; "
                   "for a folder: the folder to write into")
    p.add_argument("--plan-only", action="store_true",
                   help="only capture (on fake tensors) and split into fusion groups: print the plan, compile nothing")
    p.add_argument("--report", help="also write the markdown report here")
    p.add_argument("--target", default="auto", help="GPU profile: h200, h100, a100, v100 (default: the present GPU, else h200)")
    p.add_argument("--max-steps", type=int, default=8, help="planner moves per fusion group after its first draft")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds for one verification or module check")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="wall seconds for the whole module: once too little is left for the module check, groups "
                   "not started stay PyTorch and planners stop moving (a big network still comes back checked)")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    p.add_argument("--no-time", action="store_true",
                   help="skip the end-to-end timing of ModelNew against eager and torch.compile (for callers that time it)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="on a GPU, try ModelNew's whole forward replayed as one CUDA graph, kept where measured faster "
                   "and passed by the guard (experimental: not yet run on a GPU)")
    p.add_argument("--allow-tf32", action="store_true",
                   help="let fp32 conv and matmul groups use TF32 products (10-bit mantissa, as cuDNN's default TF32 "
                   "convs): faster, with TF32-sized error; each group's check widens its fp32 bound 16x and the module "
                   "check 64x to match")
    p.add_argument("--redo", action="store_true", help="for a folder: optimize modules already recorded in OUTDIR again")
    add_cluster_args(p)
    p.set_defaults(func=cmd_optimize)


# -- a folder of modules --------------------------------------------------------------------------

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
    with contextlib.nullcontext(engine) if engine else open_engine(args) as engine:
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
