"""`mtmc` command line (`python -m mtmc.commands.cli`).  Each subcommand lives in
mtmc/commands/<name>.py with register(sub); this dispatcher is the one module of the package
that imports the others."""
from __future__ import annotations

import argparse
import sys

from mtmc.commands import generate, memory, optimize, verify

# One module per subcommand; add it here to add a command.
COMMANDS = [generate, memory, optimize, verify]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtmc", description="Verified, measured Triton kernels from words or modules.")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
