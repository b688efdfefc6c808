"""The product's own GPU runs as policy data: measured drafts from the memory's history log.

Every `mtmc generate` / `mtmc optimize` run on a GPU stores its history (memory.log): each step's
config, its verdict (stage, compiled resources) and its median GPU time at the real dims.  Those
drafts are measurements of exactly the specs users bring, in every family the catalog serves
(convs with their epilogues, pools, norms, attention, scans, losses), so each benchmark run on the
device grows the dataset the cost model and the policy train on (policy.train) with no extra GPU
time.  `harvest` turns the measured histories of a log into dataset records and appends the new
ones (not already in the dataset for that GPU) as one file, `<date>-<gpu>-harvest-<run>.jsonl.gz`.

Only measured histories count: an offline run's times are roofline estimates.  Custom groups
(kernels the model wrote) have no config to learn from and are skipped.

    python -m bench.harvest [$MTMC_HOME | histories.jsonl ...] [--out bench/data/policy]
"""
from __future__ import annotations

import argparse
import platform
import secrets
import sys
from pathlib import Path

from bench.collect import profile_key_of
from mtmc.kernels.spec import CUSTOM_FAMILY, KernelSpec
from mtmc.memory.log import HistoryLog
from mtmc.policy import dataset
from mtmc.policy.actions import config_key

# verifier failure kinds (kernels.drafts) as the dataset's stages; resource violations are what
# the collector records as "masked" (the target GPU does not allow the config)
_STAGE_OF_KIND = {"compile_error": "compile_error", "runtime_error": "compile_error",
                  "wrong_values": "wrong", "guard_rejected": "wrong",
                  "timed_out": "timeout", "crashed": "timeout"}


def _stage(verdict: dict) -> str | None:
    if verdict.get("ok"):
        return "ok"
    kind = verdict.get("kind")
    if kind in _STAGE_OF_KIND:
        return _STAGE_OF_KIND[kind]
    return "masked" if verdict.get("stage") == "compile" else None


def records_from_history(h: dict, run: str) -> list[dict]:
    """One dataset record per distinct config a measured history tried (none for an unmeasured
    history or a custom group)."""
    spec_d = {k: v for k, v in (h.get("spec") or {}).items() if k != "request"}
    if not h.get("measured") or not spec_d or spec_d.get("family") == CUSTOM_FAMILY:
        return []
    try:
        spec = KernelSpec.from_dict(spec_d)
    except (KeyError, TypeError, ValueError):
        return []
    gpu = h.get("gpu") or {}
    versions = {"torch": (h.get("versions") or {}).get("torch"), "triton": (h.get("versions") or {}).get("triton"),
                "python": platform.python_version(), "mtmc_commit": None}
    out, seen = [], set()
    for step in h.get("steps") or []:
        config, verdict = step.get("config"), step.get("verdict")
        if not isinstance(config, dict) or not isinstance(verdict, dict):
            continue
        stage = _stage(verdict)
        key = config_key(config)
        if stage is None or key in seen:
            continue
        seen.add(key)
        ms = verdict.get("time_ms") if stage == "ok" and verdict.get("measured") else None
        report = verdict.get("resources")
        resources = dataset.resources_of(report) if isinstance(report, dict) else dataset.no_resources()
        out.append(dataset.Record(
            spec=spec_d, spec_key=spec.key(), family=spec.family, config=config, config_key=key,
            resources=resources, legal=stage != "masked", stage=stage,
            error=None if stage == "ok" else (verdict.get("detail") or verdict.get("kind") or "")[:300],
            ms=ms, measured=ms is not None, gpu=profile_key_of(str(gpu.get("name", ""))) or "unknown", device_name=str(gpu.get("name", "")),
            date=str(h.get("created", ""))[:10], versions=versions, run=run,
            set=dataset.split_of(spec.key())).to_dict())
    return out


def _logs(sources: list[str]) -> list[Path]:
    """histories.jsonl files: given directly, or under an MTMC_HOME's memory/ folder."""
    paths = []
    for s in sources:
        p = Path(s)
        paths.append(p / "memory" / "histories.jsonl" if p.is_dir() else p)
    return [p for p in paths if p.is_file()]


def new_run() -> str:
    return "harvest-" + secrets.token_hex(4)


def harvest(sources: list[str], out_dir: str | Path = dataset.DEFAULT_DIR, run: str | None = None
            ) -> tuple[Path | None, int]:
    """Append the new measured drafts of the logs under `sources` to the file of `run` (a new run
    when None: a new file) in `out_dir`; returns (that file or None, how many records)."""
    out_dir = Path(out_dir)
    run = run or new_run()
    existing = dataset.load(out_dir) if out_dir.is_dir() else []
    done: dict[str, set] = {}   # per GPU, as the collector counts them (the interpreter's rows apart)
    rows = []
    for log in _logs(sources):
        for h in HistoryLog(log).records().values():
            for r in records_from_history(h, run):
                have = done.setdefault(r["gpu"], dataset.done_keys(existing, r["gpu"]))
                k = (r["spec_key"], r["config_key"], r["gpu"])
                if k not in have:
                    have.add(k)
                    rows.append(r)
    if not rows:
        return None, 0
    path = out_dir / dataset.file_name(rows[0]["date"] or "undated", rows[0]["gpu"], run)
    dataset.append(path, rows)
    return path, len(rows)


def main(argv=None) -> int:
    from mtmc.tools.paths import home
    ap = argparse.ArgumentParser(prog="python -m bench.harvest", description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="*", help="MTMC_HOME folders or histories.jsonl files (default: $MTMC_HOME)")
    ap.add_argument("--out", default=str(dataset.DEFAULT_DIR), help="the dataset folder")
    args = ap.parse_args(argv)
    path, n = harvest(args.sources or [str(home())], args.out)
    print(f"{n} new measured draft(s)" + (f" -> {path}" if path else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
