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


def env_llm(fallback: str):
    """The chat model named by MTMC_LLM_BASE_URL / MTMC_LLM_MODEL, or None (offline); a model that
    cannot be built is said on stderr with what happens instead (`fallback`)."""
    from mtmc.tools.llm import LLMFailure, from_env
    try:
        return from_env()
    except LLMFailure as exc:
        print(f"mtmc: MTMC_LLM_BASE_URL is set but {exc}; {fallback}", file=sys.stderr)
        return None
