"""The policy's measurement dataset on disk: one JSON record per (spec, config) per GPU.

Files are gzip JSON lines under bench/data/policy/, one per collection run
(`<date>-<gpu>-<runid>.jsonl.gz`), never rewritten: runs on several machines merge by adding
files.  Each batch is appended as a gzip member of its own and synced, so a run killed mid-way
keeps every batch it finished; `load` reads past a truncated last member.

A record (a dict on disk; `Record` builds one):
  spec (KernelSpec.to_dict(), request dropped), spec_key, family, config, config_key
  (policy.actions.config_key), resources {regs, spills, smem, threads, occupancy} (None each when
  not compiled), legal (the resource model and the compile allow it), stage ("masked",
  "compile_error", "wrong", "timeout", "ok"), error (short text or None), ms (median GPU time, only
  when stage is "ok" and measured), measured (real GPU timing), gpu (hardware profile, "h200"),
  device_name (torch's, or "cpu"), date, versions {torch, triton, python, mtmc_commit}, run,
  set ("train" | "heldout", `split_of(spec_key)`).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path

STAGES = ("masked", "compile_error", "wrong", "timeout", "ok")
RESOURCE_FIELDS = ("regs", "spills", "smem", "threads", "occupancy")
HELDOUT_FRACTION = 0.2
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "bench" / "data" / "policy"


@dataclass
class Record:
    spec: dict
    spec_key: str
    family: str
    config: dict
    config_key: str
    resources: dict
    legal: bool
    stage: str
    error: str | None
    ms: float | None
    measured: bool
    gpu: str
    device_name: str
    date: str
    versions: dict
    run: str
    set: str

    def to_dict(self) -> dict:
        return asdict(self)


FIELDS = tuple(f.name for f in fields(Record))


def no_resources() -> dict:
    return dict.fromkeys(RESOURCE_FIELDS)


def resources_of(report: dict) -> dict:
    """The dataset's resources of a ResourceReport dict (tools.target_compile): the worst kernel of
    the source's launches.  The planner reads a draft's verdict the same way."""
    ks = [k for k in report.get("kernels", []) if not k.get("error")]
    regs = [k["regs"] for k in ks if k.get("regs") is not None]
    return {"regs": max(regs) if regs else None,
            "spills": max(k.get("spill_bytes", 0) for k in ks) if ks and regs else None,
            "smem": max(k.get("shared_bytes", 0) for k in ks) if ks else None,
            "threads": max(k["num_warps"] * 32 for k in ks) if ks else None,
            "occupancy": min(k.get("occupancy", 0.0) for k in ks) if ks else None}


def unit(*parts) -> float:
    """A number in [0, 1) fixed by the parts alone (the same in every process, run and machine)."""
    return int(hashlib.sha1(":".join(map(str, parts)).encode()).hexdigest()[:8], 16) / 2**32


def split_of(spec_key: str) -> str:
    """"heldout" for about HELDOUT_FRACTION of spec keys, else "train"; all of one spec's rows
    share it.  (The collector also balances each family's specs over the two sets.)"""
    return "heldout" if unit("split", spec_key) < HELDOUT_FRACTION else "train"


def file_name(date: str, gpu: str, run: str) -> str:
    return f"{date}-{gpu}-{run}.jsonl.gz"


def append(path: str | os.PathLike, records: list[dict]) -> None:
    """Append `records` as one gzip member, flushed and fsynced before returning."""
    if not records:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records).encode()
    with open(path, "ab") as f:
        f.write(gzip.compress(body, compresslevel=9))
        f.flush()
        os.fsync(f.fileno())


def _members(data: bytes):
    """The decompressed gzip members of `data`, stopping quietly at a truncated or corrupt one."""
    while data:
        d = zlib.decompressobj(wbits=31)
        try:
            body = d.decompress(data)
        except zlib.error:
            return
        if not d.eof:          # cut short: the run was killed while writing this member
            return
        yield body
        data = d.unused_data


def paths_of(paths_or_dir) -> list[Path]:
    """Every dataset file named, or found in a named folder, sorted."""
    items = [paths_or_dir] if isinstance(paths_or_dir, (str, os.PathLike)) else list(paths_or_dir)
    out = []
    for p in map(Path, items):
        out += sorted(p.glob("*.jsonl.gz")) if p.is_dir() else [p] if p.exists() else []
    return out


def load(paths_or_dir=DEFAULT_DIR) -> list[dict]:
    """All records of the files (or folders of files) given, in file order."""
    records = []
    for path in paths_of(paths_or_dir):
        for body in _members(path.read_bytes()):
            lines = body.decode().splitlines()
            for line in lines:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:   # a member cannot end mid-line; skip rather than fail
                    continue
    return records


def done_keys(records_or_paths, gpu: str, on_cpu: bool = False) -> set[tuple[str, str, str]]:
    """(spec_key, config_key, gpu) of the rows already collected for `gpu`, by the same kind of
    run (a GPU run does not count the interpreter's unmeasured rows as done, nor the reverse)."""
    records = records_or_paths if isinstance(records_or_paths, list) and (
        not records_or_paths or isinstance(records_or_paths[0], dict)) else load(records_or_paths)
    return {(r["spec_key"], r["config_key"], r["gpu"]) for r in records
            if r.get("gpu") == gpu and (r.get("device_name") == "cpu") == on_cpu}
