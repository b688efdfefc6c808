"""What every benchmark script records: the run's metadata (date, GPU, versions) and a table
saved after every row, so a device call cut short keeps what it measured."""
from __future__ import annotations

import datetime as dt
import json
import platform
import subprocess
import sys
from pathlib import Path


def driver_version() -> str | None:
    """The NVIDIA driver's version (nvidia-smi), None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def run_meta(**extra) -> dict:
    import torch
    import triton
    gpu = torch.cuda.is_available()
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(0) if gpu else "no GPU (estimates)",
            "driver": driver_version() if gpu else None, "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), **extra}


def save_rows(out_dir: str, stem: str, meta: dict, rows: list[dict]) -> Path:
    """A diagnosis's rows and run meta as OUT_DIR/STEM.json (no table); the meta is printed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(json.dumps(meta))
    return path


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

    def add(self, rows: list[dict], new: list[dict]) -> None:
        """Append a task's rows, print them (the device log keeps them even if the call dies),
        save everything, and give the GPU memory back before the next task."""
        import torch
        rows += new
        for r in new:
            print(json.dumps(r, default=str), flush=True)
        self.save(rows)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def save(self, rows: list[dict], **summary) -> None:
        """`summary` (e.g. per-level totals) goes into the JSON beside meta and rows."""
        (self.dir / f"{self.stem}.json").write_text(json.dumps({"meta": self.meta, **summary, "rows": rows},
                                                               indent=1, default=str))
        self.markdown.write_text(f"# {self.title}\n\n{json.dumps(self.meta, default=str)}\n\n" + self.table(rows))


def add_output_args(parser) -> None:
    """--out and --name, the same in every benchmark script."""
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--name", default=None, help="file stem of the results (default: date, kind and GPU)")


def gpu_profile(script: str):
    """The present GPU's hardware profile, or None (saying so) where there is none."""
    import torch

    from mtmc.tools.hardware import resolve
    if not torch.cuda.is_available():
        print(f"{script} measures on a GPU; none here", file=sys.stderr)
        return None
    return resolve("auto")


def cell(v, fmt: str = "") -> str:
    """A table cell: numbers formatted, a missing value as "-"."""
    if v is None:
        return "-"
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def markdown_table(rows: list[dict], columns: list[tuple]) -> str:
    """columns: (header, key or function of the row, format); every benchmark table is one."""
    out = ["| " + " | ".join(c[0] for c in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        vals = [c[1](r) if callable(c[1]) else r.get(c[1]) for c in columns]
        out.append("| " + " | ".join(cell(v, c[2] if len(c) > 2 else "") for v, c in zip(vals, columns)) + " |")
    return "\n".join(out) + "\n"
