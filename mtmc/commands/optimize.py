"""`mtmc optimize MODEL.py --out NEW.py`: a faster drop-in ModelNew for an uploaded module;
`--plan-only`: only how it would be split (capture and partition, nothing compiled);
`mtmc optimize DIR --out OUTDIR [--workers N]`: every module below DIR (commands.batch)."""
from __future__ import annotations

import json
import os
import sys

from mtmc.agents.context import Context
from mtmc.agents.module_flow import optimize_module, plan_module
from mtmc.commands import batch, known_target
from mtmc.agents.events.text import printer
from mtmc.tools import isolation
from mtmc.tools.cluster import add_cluster_args
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
        return batch.run_batch(args)
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
    ctx = Context(target=args.target, max_steps=args.max_steps, timeout_s=args.timeout)
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
    p.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    p.add_argument("--redo", action="store_true", help="for a folder: optimize modules already recorded in OUTDIR again")
    add_cluster_args(p)
    p.set_defaults(func=cmd_optimize)
