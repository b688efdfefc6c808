"""Where the product keeps its data: $MTMC_HOME, else ~/.mtmc."""
from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    path = Path(os.environ.get("MTMC_HOME") or Path.home() / ".mtmc")
    path.mkdir(parents=True, exist_ok=True)
    return path


def artifacts_dir() -> Path:
    path = home() / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path
