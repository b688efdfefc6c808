"""One module per `mtmc` subcommand, each with register(subparsers)."""
from __future__ import annotations

import sys


def known_target(target: str) -> bool:
    """True for a usable --target; otherwise says why on stderr (the caller exits 2)."""
    from mtmc.tools.hardware import resolve
    try:
        resolve(target)
    except ValueError as exc:
        print(f"mtmc: {exc}", file=sys.stderr)
        return False
    return True
