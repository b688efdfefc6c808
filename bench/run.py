"""Run benchmark requests through the whole agent graph and save a table with date and GPU.

  python -m bench.run [--tasks spine] [--max-steps N] [--out bench/results]

On a GPU every draft is checked at the real shape and timed against PyTorch eager and
torch.compile in the same child process; without one the times are estimates and say so.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from bench.record import Results, run_meta
from bench.tasks import (ATTENTION_TASKS, EXTRAS2_TASKS, EXTRAS_TASKS, NORM_TASKS, POINTRED_TASKS, POOLING_TASKS,
                         SCANLOSS_TASKS, SPINE_TASKS)
from mtmc.agents.context import Context
from mtmc.agents.runner import run_request, summary_json

TASKS = {"spine": SPINE_TASKS, "pooling": POOLING_TASKS, "pointred": POINTRED_TASKS, "scanloss": SCANLOSS_TASKS,
         "extras": EXTRAS_TASKS, "norm": NORM_TASKS, "attention": ATTENTION_TASKS, "extras2": EXTRAS2_TASKS}


def run_tasks(requests: list[str], ctx: Context, save=lambda rows: None) -> list[dict]:
    rows = []
    for req in requests:
        t0 = time.time()
        try:
            state = run_request(req, ctx)
            summary = summary_json(state)
        except Exception as exc:  # one broken task must not lose the others' numbers
            summary = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
        summary["request"] = req
        summary["wall_s"] = round(time.time() - t0, 1)
        rows.append(summary)
        print(f"{summary['status']:>11}  {summary.get('final_time_ms')}  {req}  ({summary['wall_s']} s)", flush=True)
        save(rows)  # after every task: a call cut short keeps what it measured
    return rows


def table(rows: list[dict]) -> str:
    head = "| request | correct | ours (ms) | eager (ms) | torch.compile (ms) | vs eager | vs compile | steps | final config |\n"
    head += "|---|---|---|---|---|---|---|---|---|\n"
    lines = []
    for r in rows:
        ours = r.get("final_time_ms")
        base = r.get("baselines") or {}
        eager, comp = base.get("eager_ms"), base.get("compile_ms")
        fmt = lambda x: f"{x:.4f}" if isinstance(x, (int, float)) else "-"
        ratio = lambda b: f"{b / ours:.2f}x" if isinstance(b, (int, float)) and ours else "-"
        lines.append(f"| {r['request']} | {'yes' if r.get('status') == 'done' else r.get('status')} | {fmt(ours)} | "
                     f"{fmt(eager)} | {fmt(comp)} | {ratio(eager)} | {ratio(comp)} | {len(r.get('steps', []))} | "
                     f"`{json.dumps(r.get('final_config'))}` |")
    return head + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", default="spine", choices=sorted(TASKS))
    p.add_argument("--only", type=int, nargs="*", help="indices of tasks to run")
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--name", default=None)
    args = p.parse_args(argv)
    requests = TASKS[args.tasks]
    if args.only:
        requests = [requests[i] for i in args.only]
    ctx = Context(max_steps=args.max_steps, out_path=None)
    results = Results(args.out, args.name, args.tasks, f"{args.tasks} benchmark", table,
                      run_meta(max_steps=args.max_steps))
    rows = run_tasks(requests, ctx, results.save)
    print(results.markdown.read_text())
    return 0 if all(r.get("status") == "done" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
