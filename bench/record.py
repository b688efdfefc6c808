"""What every benchmark script records: the run's metadata (date, GPU, versions) and a table
saved after every row, so a device call cut short keeps what it measured."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path


def run_meta(**extra) -> dict:
    import torch
    import triton
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (estimates)"
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "gpu": gpu,
            "torch": torch.__version__, "triton": triton.__version__, **extra}


class Results:
    """bench/results/STEM.json (meta + rows) and STEM.md (title, meta, table(rows))."""

    def __init__(self, out: str, name: str | None, kind: str, title: str, table, meta: dict):
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stem = name or f"{meta['date'][:10]}-{kind}-{meta['gpu'].replace(' ', '_')}"
        self.title, self.table, self.meta = title, table, meta

    @property
    def markdown(self) -> Path:
        return self.dir / f"{self.stem}.md"

    def save(self, rows: list[dict]) -> None:
        (self.dir / f"{self.stem}.json").write_text(json.dumps({"meta": self.meta, "rows": rows}, indent=1,
                                                               default=str))
        self.markdown.write_text(f"# {self.title}\n\n{json.dumps(self.meta, default=str)}\n\n" + self.table(rows))
