"""`mtmc verify REFERENCE.py CANDIDATE.py [--json]`: is CANDIDATE's ModelNew a correct, honest
replacement for REFERENCE's Model?  Exit 0 only when accepted; 1 when rejected, crashed or timed
out; 2 when the files or the reference are unusable."""
from __future__ import annotations

import json
import sys

from mtmc.module.module_file import ModuleFileError, check_file
from mtmc.tools import isolation
from mtmc.tools.guard.report import format_verdict
from mtmc.tools.guard.verifier import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, verify


def cmd_verify(args) -> int:
    for p in (args.reference, args.candidate):
        try:
            check_file(p)   # the chat's upload rules: .py only, under its size limit
        except ModuleFileError as exc:
            print(f"mtmc verify: {exc}", file=sys.stderr)
            return 2
    device = None if args.device == "auto" else args.device
    print(isolation.status().line(), file=sys.stderr)
    try:
        verdict = verify(args.reference, args.candidate, device=device, timeout_s=args.timeout,
                         memory_mb=args.memory_mb)
    except isolation.IsolationUnavailable as e:
        print(f"mtmc verify: {e}", file=sys.stderr)
        return 2
    print(json.dumps(verdict, indent=2, default=str) if args.json else format_verdict(verdict))
    if verdict["outcome"] == "invalid reference":
        return 2
    return 0 if verdict["accepted"] else 1


def register(sub) -> None:
    v = sub.add_parser("verify", help="check a ModelNew against a Model: correctness and every known cheat")
    v.add_argument("reference", help="file defining Model, get_inputs, get_init_inputs")
    v.add_argument("candidate", help="file defining ModelNew (same constructor as Model)")
    v.add_argument("--json", action="store_true", help="print the verdict as JSON")
    v.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cpu: Triton's interpreter on CPU tensors; cuda: the GPU (default: cuda when present)")
    v.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds for each child process")
    v.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB, help="address-space cap of CPU children")
    v.set_defaults(func=cmd_verify)
