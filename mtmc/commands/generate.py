"""`mtmc generate "REQUEST" --out FILE`: a kernel from words."""
from __future__ import annotations

import json
import sys

from mtmc.agents.context import Context, env_llm, known_target
from mtmc.agents.runner import run_request, summary_json
from mtmc.agents.events.text import printer


def cmd_generate(args) -> int:
    if not known_target(args.target):
        return 2
    ctx = Context(target=args.target, max_steps=args.max_steps, out_path=args.out, timeout_s=args.timeout,
                  llm=env_llm("reading the request with the rules only"))
    log = sys.stderr if args.json else sys.stdout
    state = run_request(args.request, ctx, on_event=printer(log))
    if args.json:
        print(json.dumps(summary_json(state), indent=2, default=str))
    status = state.get("status")
    if status == "done":
        return 0
    if status == "unsupported":
        return 2
    return 1



def register(sub) -> None:
    g = sub.add_parser("generate", help="write a kernel for a request in words")
    g.add_argument("request", help='e.g. "softmax over the rows of a 4096x8192 fp16 tensor"')
    g.add_argument("--out", required=True, help="path of the kernel file to write")
    g.add_argument("--target", default="auto", help="GPU profile: h200, h100, a100, v100 (default: the present GPU, else h200)")
    g.add_argument("--max-steps", type=int, default=8, help="planner moves after the first draft")
    g.add_argument("--timeout", type=float, default=240.0, help="seconds for one verification")
    g.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    g.set_defaults(func=cmd_generate)
