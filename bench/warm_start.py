"""Does memory make a second optimization cheaper?  Measured the way the memory issue asks.

  python -m bench.warm_start [--max-steps N] [--out bench/results] [--name NAME]

For each pair (A, B) of near specs, in fresh data directories:
  cold B:  B alone, with an empty memory
  A, then warm B:  A is optimized and stored; B retrieves A's history and starts from its config
and the table compares the step at which B reached its final config, cold and warm, with the
final times (measured on a GPU; roofline estimates without one, labelled so).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from bench.record import Results, run_meta
from mtmc.agents.context import Context
from mtmc.agents.runner import run_request, summary_json

PAIRS = [
    ("matmul 4096x4096 by 4096x4096 in fp16", "matmul 4096x3072 by 3072x4096 in fp16"),
    ("softmax over the rows of a 4096x8192 fp16 tensor", "softmax over the rows of a 4096x6144 fp16 tensor"),
    ("rmsnorm on 8192 rows of width 4096 in bf16", "rmsnorm on 8192 rows of width 5120 in bf16"),
    ("matmul 2048x2048 by 2048x2048 in fp32", "matmul 2048x1536 by 1536x2048 in fp32"),
]


def _run(request: str, ctx: Context) -> dict:
    t0 = time.time()
    events: list[dict] = []
    try:
        s = summary_json(run_request(request, ctx, on_event=events.append))
    except Exception as exc:  # keep the other pairs' numbers
        s = {"status": "error", "message": f"{type(exc).__name__}: {exc}", "steps": []}
    warm = next((e.get("history", {}).get("warm_start") for e in events if e.get("event") == "code"), None)
    return {"request": request, "status": s["status"], "final_step": s.get("final_step"),
            "steps_run": len(s.get("steps", [])), "final_time_ms": s.get("final_time_ms"),
            "measured": s.get("measured"), "final_config": s.get("final_config"), "warm_start": warm,
            "wall_s": round(time.time() - t0, 1), "message": (s.get("message") or "")[:300]}


def _in_fresh_home(fn):
    old = os.environ.get("MTMC_HOME")
    with tempfile.TemporaryDirectory(prefix="mtmc-warm-") as home:
        os.environ["MTMC_HOME"] = home
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop("MTMC_HOME", None)
            else:
                os.environ["MTMC_HOME"] = old


def measure_pair(a: str, b: str, ctx: Context) -> dict:
    cold = _in_fresh_home(lambda: _run(b, ctx))
    first, warm = _in_fresh_home(lambda: (_run(a, ctx), _run(b, ctx)))
    return {"first": first, "cold": cold, "warm": warm}


def table(rows: list[dict]) -> str:
    out = ["| spec B (after A) | B cold: final step / steps run / ms | B warm: final step / steps run / ms | "
           "warm started from A | same final config |", "|---|---|---|---|---|"]
    fmt = lambda r: f"{r['final_step']} / {r['steps_run']} / " + (
        f"{r['final_time_ms']:.4f}" if isinstance(r["final_time_ms"], (int, float)) else "-") + (
        "" if r["measured"] else " (est.)")
    for row in rows:
        c, w = row["cold"], row["warm"]
        out.append(f"| {w['request']} | {fmt(c)} | {fmt(w)} | {'yes' if w['warm_start'] else 'no'} | "
                   f"{'yes' if c['final_config'] == w['final_config'] else 'no'} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--only", type=int, nargs="*", help="indices of pairs to run")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--name", default=None)
    args = p.parse_args(argv)
    pairs = [PAIRS[i] for i in args.only] if args.only else PAIRS
    results = Results(args.out, args.name, "warm-start", "warm start from memory", table,
                      run_meta(max_steps=args.max_steps))
    ctx = Context(max_steps=args.max_steps)
    rows = []
    for a, b in pairs:
        rows.append(measure_pair(a, b, ctx))
        print(json.dumps({k: {kk: v[kk] for kk in ("final_step", "steps_run", "final_time_ms", "warm_start")}
                          for k, v in rows[-1].items()}), flush=True)
        results.save(rows)
    print(results.markdown.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
