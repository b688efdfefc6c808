"""KernelBench-format tasks through the product exactly as a user runs it, with per-level totals.

  python -m bench.kernelbench [FOLDER] [--levels 1 2 3] [--only PATTERN ...] [--limit N] [--out NAME]
        [--redo] [--timeout S] [--max-steps N] [--target NAME] [--device auto|cpu|cuda] [--budget S]

FOLDER holds level1/, level2/, ... of task files (default: ../shared/kernelbench-dev beside the
repo).  Per task:
  1. `mtmc optimize TASK.py --out NEW.py --json` in a subprocess with a wall timeout;
  2. the "module_eval" job in a sandboxed child (mtmc.tools.module_time): NEW's ModelNew against
     TASK's Model on fresh input sets, KernelBench's way; our Triton kernels' launches and share
     of GPU time; ModelNew's time on a GPU;
  3. on a GPU, when ModelNew is correct: the original Model's eager and torch.compile times
     ("module_baseline" jobs, one child per mode), cached in RESULTS/kernelbench-baselines.jsonl
     by (task sha256, GPU, torch, triton, mode), so no later run compiles them again.
  4. on a GPU, the measured drafts of the task's run join the policy's dataset (--policy-data,
     bench.harvest).
RESULTS/NAME.jsonl gets one line per task as soon as it finishes (a re-run skips the tasks
recorded there unless --redo; a task's last line wins); NAME.md (per-level and per-task tables)
and NAME.json (meta, per-level totals, rows) are rewritten after every task.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import fnmatch
import hashlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.record import Results, run_meta
from mtmc.memory.shared import merge_from_workers
from bench import harvest
from mtmc.tools.cluster import Engine, add_cluster_args, die_with_parent, open_engine
from mtmc.tools.isolation import Confinement
from mtmc.tools.worker import run_job

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FOLDER = REPO.parent / "shared" / "kernelbench-dev"
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
BASELINE_MODES = ("eager", *COMPILE_MODES)
TOLERANCES = ("1e-2", "1e-4")
GROUP_LINES = 40
FAST_TOL = "1e-2"   # "correct" in fast_1 and the geometric means: KernelBench's papers' tolerance
UNFINISHED = ("timed out", "crashed")   # what --retry runs again
EVALUATED = ("done", "failed")   # optimize statuses that leave a ModelNew file to evaluate
CPU_MEMORY_MB = 8192   # the CPU evaluation child's cap (a GPU child gets none: CUDA reserves far more)
LOG_TAIL_LINES = 15
TIMELINE_LINES = 80   # progress lines kept with their arrival time in each record


@dataclasses.dataclass
class Task:
    rel: str      # "level1/19_ReLU.py": the key of its record
    level: int
    path: Path


# -- tasks ----------------------------------------------------------------------------------

def _order(rel: str) -> tuple:
    """level, then the task's number, then its name."""
    level, name = rel.split("/", 1)
    number = re.match(r"\d+", name)
    return int(level.removeprefix("level") or 0), int(number.group()) if number else math.inf, name


def _matches(rel: str, patterns: list[str]) -> bool:
    """A glob (when it has * ? [) against the path or the file name, else a substring of the path."""
    name = rel.split("/", 1)[1]
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) if any(c in p for c in "*?[") else p in rel
               for p in patterns)


def find_tasks(folder: Path, levels: list[int] | None = None, only: list[str] | None = None,
               limit: int | None = None) -> list[Task]:
    tasks = []
    for path in folder.glob("level*/*.py"):
        level = int(path.parent.name.removeprefix("level")) if path.parent.name[5:].isdigit() else None
        rel = f"{path.parent.name}/{path.name}"
        if level is None or (levels and level not in levels) or (only and not _matches(rel, only)):
            continue
        tasks.append(Task(rel, level, path.resolve()))
    tasks.sort(key=lambda t: _order(t.rel))
    return tasks[:limit] if limit is not None else tasks


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- 1. optimize, as a user would -------------------------------------------------------------

def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (read from /proc: children started in their own sessions,
    like the sandbox's workers, are not in its process group)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """Still running (a zombie holds no memory, GPU memory included)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def kill_tree(pid: int, wait_s: float = 30.0) -> None:
    """SIGKILL `pid`, everything below it and their process groups (a group's id is its
    leader's pid, so only groups these processes lead), then wait up to wait_s for them to be
    gone: a dying CUDA process still holds its GPU memory, which the next child needs."""
    pids = [pid, *_descendants(pid)]
    for p in pids:
        for kill in (os.killpg, os.kill):
            try:
                kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + wait_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


# optimize's own --time-budget, as a share of the runner's wall timeout: the rest covers the
# interpreter's start and the margin, so a big network comes back checked instead of killed
TIME_BUDGET_SHARE = 0.85


def optimize_command(task: Task, new_path: Path, max_steps: int | None, target: str | None,
                     timeout_s: float | None = None, cuda_graph: bool = False, allow_tf32: bool = False) -> list[str]:
    # --no-time: the evaluation below times ModelNew and the baselines itself (12-17 s a task saved)
    cmd = [sys.executable, "-m", "mtmc.commands.cli", "optimize", str(task.path), "--out", str(new_path), "--json",
           "--no-time"]
    if timeout_s:
        cmd += ["--time-budget", f"{TIME_BUDGET_SHARE * timeout_s:g}"]
    if max_steps is not None:
        cmd += ["--max-steps", str(max_steps)]
    if target:
        cmd += ["--target", target]
    if cuda_graph:
        cmd.append("--cuda-graph")
    if allow_tf32:
        cmd.append("--allow-tf32")
    return cmd


def parse_summary(stdout: bytes) -> dict | None:
    """optimize's --json summary: the JSON object on stdout (from its first line that opens one)."""
    text = stdout.decode("utf-8", "replace")
    for start in [0] + [m.start() + 1 for m in re.finditer(r"\n\{", text)]:
        try:
            summary = json.loads(text[start:])
        except ValueError:
            continue
        return summary if isinstance(summary, dict) else None
    return None


def _tail(path: Path) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
    except OSError:
        return ""


def run_optimize(cmd: list[str], log_path: Path, timeout_s: float, scratch: Path | None = None) -> dict:
    """Run `mtmc optimize` with a wall timeout: status done / rejected / failed / timed out /
    crashed, seconds, groups and kernels, and the message when it is not done.  Whatever
    happens (timeout, an interrupt of this runner), nothing it started outlives it; with
    `scratch`, its temporary files (the guard's exchange files: GBs at KernelBench sizes) go
    there, for the caller to remove even when the run was killed and could not clean up."""
    start = time.monotonic()
    env = {**os.environ, "TMPDIR": str(scratch)} if scratch is not None else None
    timeline: list[list] = []
    # stderr through a pipe of our own, so communicate() reads stdout alone: a thread copies the
    # progress lines to the log and notes when each came (where a task's time goes)
    err_r, err_w = os.pipe()
    with open(log_path, "wb") as log, os.fdopen(err_r, "rb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err_w, cwd=REPO,
                                start_new_session=True, env=env, preexec_fn=die_with_parent)
        os.close(err_w)
        tee = threading.Thread(target=_tee_timed, args=(err, log, start, timeline), daemon=True)
        tee.start()
        try:
            stdout, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stdout = None
        finally:
            kill_tree(proc.pid)
            proc.wait()
            tee.join(timeout=10)
    out = {"status": None, "seconds": round(time.monotonic() - start, 1), "rc": proc.returncode,
           "groups": None, "kernels": None, "check": None, "message": None}
    summary = parse_summary(stdout) if stdout is not None else None
    if stdout is None:
        out.update(status="timed out", message=f"no result within {timeout_s:g} s; its processes were killed")
    elif summary is None:
        out.update(status="crashed", message=f"exit status {proc.returncode}, no JSON summary")
    else:
        groups = summary.get("groups") or []
        out.update(status=summary.get("status"), groups=len(groups),
                   kernels=sum(g.get("status") == "kernel" for g in groups),
                   check=(summary.get("check") or {}).get("status"))
        if out["status"] != "done":
            out["message"] = (summary.get("message") or "")[:1000]
    if out["status"] != "done":
        out["message"] = "\n".join(filter(None, [out["message"], _tail(log_path)]))[-2000:]
    out["outcomes"] = group_outcomes(log_path)
    out["timeline"] = timeline[:TIMELINE_LINES]
    return out


def _tee_timed(stream, log, start: float, timeline: list) -> None:
    """Copy optimize's progress lines to its log; note the second each step line arrived."""
    for raw in iter(stream.readline, b""):
        log.write(raw)
        log.flush()
        line = raw.decode("utf-8", "replace").strip()
        if line.startswith(("[", "==", "isolation", "memory:")):
            timeline.append([round(time.monotonic() - start, 1), line[:400 if line.startswith("[time]") else 90]])


def group_outcomes(log_path: Path) -> list[str]:
    """What happened to each group and to the module check, from optimize's progress lines:
    why a group kept PyTorch is the first thing to read when a task comes back at 1.00x."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln.strip()[:300] for ln in lines if ln.startswith(("== group", "[module"))][:GROUP_LINES]


# -- 2. evaluate, and 3. the baselines ----------------------------------------------------------

def job_outcome(result: dict) -> dict:
    """A sandbox result as {"status": "ok", **its result} or {"status": "error" | "timed out" |
    "crashed", "message"}, with the child's seconds."""
    seconds = round(result.get("wall_s") or 0.0, 1)
    status = result.get("status")
    if status == "ok":
        return {"status": "ok", **result["result"], "seconds": seconds}
    if status == "error":
        message = f"{result.get('error_type')}: {result.get('message', '')}"
    else:
        message = f"{result.get('detail', '')}\n{result.get('stderr_tail') or ''}"
    return {"status": status.replace("_", " ") if status else "crashed", "message": message.strip()[-2000:],
            "seconds": seconds}


def run_eval(task: Task, new_path: Path, device: str, trials: int, timeout_s: float) -> dict:
    job = {"kind": "module_eval", "path": str(task.path), "new_path": str(new_path.resolve()), "device": device,
           "trials": trials, "time": True}
    confine = Confinement(ro=[str(task.path), str(new_path.resolve())], gpu=device != "cpu")
    return job_outcome(run_job(job, timeout_s, memory_mb=CPU_MEMORY_MB, interpret=device == "cpu", confine=confine))


class BaselineCache:
    """The original Models' eager and torch.compile times, one JSON line per (task sha256, GPU,
    torch, triton, mode), shared by every run and session."""

    def __init__(self, path: Path | None, env: dict, lines: list[dict] | None = None):
        """path None: a copy in a cluster's worker, which writes nothing; `added` holds its new
        lines for the client to keep."""
        self.path, self.env = path, {k: env[k] for k in ("gpu", "torch", "triton")}
        self.entries: dict[tuple, dict] = {}
        self.added: list[dict] = []
        for line in _lines(path) if lines is None else lines:
            if "sha256" in line and "mode" in line:
                self.entries[self._key(line["sha256"], line["mode"], line)] = line

    def _key(self, sha: str, mode: str, env: dict) -> tuple:
        return sha, mode, env.get("gpu"), env.get("torch"), env.get("triton")

    def get(self, sha: str, mode: str) -> dict | None:
        return self.entries.get(self._key(sha, mode, self.env))

    def put(self, sha: str, mode: str, entry: dict) -> None:
        self.keep({"sha256": sha, "mode": mode, **self.env, **entry})

    def keep(self, line: dict) -> None:
        self.entries[self._key(line["sha256"], line["mode"], line)] = line
        self.added.append(line)
        if self.path is not None:
            _append(self.path, line)


def reusable(entry: dict | None, timeout_s: float) -> bool:
    """A cached baseline stands unless it timed out under a shorter timeout than this run's."""
    return entry is not None and (entry["status"] != "timed out" or entry.get("timeout_s", 0) >= timeout_s)


def measure_baseline(task: Task, mode: str, timeout_s: float) -> dict:
    r = job_outcome(run_job({"kind": "module_baseline", "path": str(task.path), "mode": mode, "device": "cuda"},
                            timeout_s, interpret=False, confine=Confinement(ro=[str(task.path)], gpu=True)))
    if r["status"] == "ok" and r.get("ms") is None:
        r["status"] = "failed"   # torch.compile raised: a fact about the baseline
    return {**r, "timeout_s": timeout_s}


def baselines(task: Task, sha: str, cache: BaselineCache, timeout_s: float,
              modes: tuple[str, ...] = COMPILE_MODES) -> dict:
    """Eager and torch.compile times of the task's Model, from the cache or measured (and
    cached unless the child crashed or raised, which may not happen again)."""
    out = {}
    for mode in ("eager", *modes):
        entry = cache.get(sha, mode)
        if not reusable(entry, timeout_s):
            entry = measure_baseline(task, mode, timeout_s)
            if entry["status"] in ("ok", "failed", "timed out"):
                cache.put(sha, mode, entry)
        out[mode] = entry
    return out


# -- one record ---------------------------------------------------------------------------------

def compile_baseline(base: dict | None) -> tuple[float | None, str | None]:
    """The torch.compile time to beat: the faster mode that compiled; eager when none did (a
    user whose compile fails runs eager)."""
    if not base:
        return None, None
    timed = [(e["ms"], mode) for mode, e in base.items() if mode in COMPILE_MODES and e.get("ms")]
    if timed:
        return min(timed)
    eager = (base.get("eager") or {}).get("ms")
    return (eager, "eager (no mode compiled)") if eager else (None, None)


def outcome(record: dict) -> dict:
    """The flat fields the tables read, from a record's optimize, eval and baselines."""
    ev = record.get("eval") or {}
    ok = ev.get("status") == "ok"
    triton = ev.get("triton") or {}
    new_ms = ev.get("new_ms") if ok else None
    eager_ms = ((record.get("baselines") or {}).get("eager") or {}).get("ms")
    compile_ms, compile_mode = compile_baseline(record.get("baselines"))
    ratio = lambda base: base / new_ms if base and new_ms else None
    return {**{f"correct_{t}": bool(ok and ev["correct"][t]) for t in TOLERANCES},
            "triton_kernel": bool(ok and triton.get("ours")), "triton_share": triton.get("gpu_share") if ok else None,
            "new_ms": new_ms, "eager_ms": eager_ms, "compile_ms": compile_ms, "compile_mode": compile_mode,
            "speedup_vs_eager": ratio(eager_ms), "speedup_vs_compile": ratio(compile_ms)}


@dataclasses.dataclass
class Options:
    device: str
    timeout: float = 300.0
    eval_timeout: float = 600.0
    compile_timeout: float = 600.0
    max_steps: int | None = None
    target: str | None = None
    trials: int = 3
    save_new: Path | None = None
    compile_modes: tuple[str, ...] = COMPILE_MODES
    cuda_graph: bool = False
    allow_tf32: bool = False


def run_task(task: Task, opts: Options, cache: BaselineCache | None) -> dict:
    start = time.monotonic()
    sha = sha256(task.path)
    record = {"task": task.rel, "level": task.level, "sha256": sha,
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": opts.device,
              "max_steps": opts.max_steps, "eval": None, "baselines": None}
    with tempfile.TemporaryDirectory(prefix="mtmc-kernelbench-") as tmp:
        new_path = Path(tmp) / task.path.name
        cmd = optimize_command(task, new_path, opts.max_steps, opts.target, opts.timeout, opts.cuda_graph,
                               opts.allow_tf32)
        scratch = Path(tmp) / "tmp"   # removed with tmp, whatever became of the run
        scratch.mkdir()
        record["optimize"] = run_optimize(cmd, Path(tmp) / "optimize.log", opts.timeout, scratch)
        if record["optimize"]["status"] in EVALUATED and new_path.exists():
            record["eval"] = run_eval(task, new_path, opts.device, opts.trials, opts.eval_timeout)
            if opts.save_new:
                keep = opts.save_new / task.rel
                keep.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(new_path, keep)
        if opts.save_new and (Path(tmp) / "optimize.log").exists():
            keep = opts.save_new / task.rel
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(tmp) / "optimize.log", keep.with_suffix(".log"))
    if cache is not None and (record["eval"] or {}).get("new_ms"):
        record["baselines"] = baselines(task, sha, cache, opts.compile_timeout, opts.compile_modes)
    record.update(outcome(record))
    record["seconds"] = round(time.monotonic() - start, 1)
    return record


# -- records ------------------------------------------------------------------------------------

def _lines(path: Path) -> list[dict]:
    """The JSON lines of a file; a line cut short by a killed run is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _append(path: Path, line: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(line, default=str) + "\n")


def latest_records(path: Path) -> dict[str, dict]:
    """Task -> its last record."""
    return {r["task"]: r for r in _lines(path) if "task" in r}


# -- totals and tables --------------------------------------------------------------------------

def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def speedup_means(records: list[dict], key: str) -> dict:
    """Geometric mean of `key` over the tasks correct at FAST_TOL with a measured speedup, and
    over every task with the others counted 1.0x (a failed task falls back to PyTorch); fast_1:
    correct and faster.  All None when no task was timed (no GPU)."""
    correct = [r[key] for r in records if r.get(f"correct_{FAST_TOL}") and r.get(key)]
    if not any(r.get(key) for r in records):
        return {"fast_1": None, "geomean_correct": None, "correct_n": 0, "geomean_all": None}
    every = [r[key] if r.get(f"correct_{FAST_TOL}") and r.get(key) else 1.0 for r in records]
    return {"fast_1": sum(s > 1.0 for s in correct), "geomean_correct": geomean(correct), "correct_n": len(correct),
            "geomean_all": geomean(every)}


def totals(records: list[dict]) -> dict:
    seconds = [r["optimize"]["seconds"] for r in records if (r.get("optimize") or {}).get("seconds") is not None]
    shares = [r["triton_share"] for r in records if r.get("triton_share") is not None]
    return {"tasks": len(records),
            "optimize_done": sum((r.get("optimize") or {}).get("status") == "done" for r in records),
            **{f"correct_{t}": sum(bool(r.get(f"correct_{t}")) for r in records) for t in TOLERANCES},
            "triton_kernel": sum(bool(r.get("triton_kernel")) for r in records),
            "triton_share_mean": statistics.fmean(shares) if shares else None, "triton_share_n": len(shares),
            "vs_eager": speedup_means(records, "speedup_vs_eager"),
            "vs_compile": speedup_means(records, "speedup_vs_compile"),
            "optimize_s_median": statistics.median(seconds) if seconds else None,
            "optimize_s_max": max(seconds) if seconds else None}


def by_level(records: list[dict]) -> dict[str, dict]:
    """Totals per level ("level1", ...) and over all tasks ("all")."""
    levels = sorted({r["level"] for r in records})
    out = {f"level{lv}": totals([r for r in records if r["level"] == lv]) for lv in levels}
    out["all"] = totals(records)
    return out


def _n(count: int | None, of: int) -> str:
    return "-" if count is None else f"{count} ({100 * count / of:.0f}%)" if of else str(count)


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def _f(value, digits: int = 3) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value:.{digits}f}" if math.isfinite(value) else str(value)


def _e(value) -> str:
    return f"{value:.1e}" if isinstance(value, (int, float)) else "-"


def level_table(levels: dict[str, dict]) -> list[str]:
    out = ["| level | tasks | optimize done | correct 1e-2 | correct 1e-4 | our Triton kernel runs "
           "| Triton share of GPU time (mean) | fast_1 vs eager | fast_1 vs torch.compile "
           "| geomean vs eager: correct (n) / all | geomean vs torch.compile: correct (n) / all "
           "| optimize s: median / max |", "|" + "---|" * 12]
    for name, t in levels.items():
        n = t["tasks"]
        e, c = t["vs_eager"], t["vs_compile"]
        out.append(f"| {name} | {n} | {_n(t['optimize_done'], n)} | {_n(t['correct_1e-2'], n)} "
                   f"| {_n(t['correct_1e-4'], n)} | {_n(t['triton_kernel'], n)} "
                   f"| {_f(t['triton_share_mean'], 2)} ({t['triton_share_n']}) | {_n(e['fast_1'], n)} "
                   f"| {_n(c['fast_1'], n)} | {_x(e['geomean_correct'])} ({e['correct_n']}) / {_x(e['geomean_all'])} "
                   f"| {_x(c['geomean_correct'])} ({c['correct_n']}) / {_x(c['geomean_all'])} "
                   f"| {_f(t['optimize_s_median'], 0)} / {_f(t['optimize_s_max'], 0)} |")
    return out


NOTES = f"""\
- correct: torch.allclose(ModelNew, Model) at atol = rtol = 1e-2 (KernelBench's papers) and 1e-4 (its
  fp32 code) on every fresh input set; "our Triton kernel runs": ModelNew launched one of its
  file's @triton.jit kernels; the Triton share is of ModelNew's GPU kernel time in one profiled call
  (mean over the n tasks evaluated on a GPU).
- fast_1: correct at {FAST_TOL} and faster than the baseline, over all tasks of the level.  torch.compile is
  the faster of the modes timed (of {' and '.join(COMPILE_MODES)}; the run's compile_modes
  say which; eager when none compiled).
- geomean "correct (n)": over the n tasks correct at {FAST_TOL} with a measured speedup; "all": over every
  task, the others (incorrect, failed, timed out) counted 1.0x, since a failed task falls back to
  PyTorch.  "-": nothing was timed (no GPU).
"""


def _cell(text) -> str:
    return " ".join(str(text or "").split()).replace("|", "/")[:160]


def task_table(records: list[dict]) -> list[str]:
    out = ["| task | optimize | s | kernels / groups | 1e-2 | 1e-4 | max abs err | our Triton | Triton share "
           "| ModelNew ms | eager ms | torch.compile ms | vs eager | vs compile | note |", "|" + "---|" * 15]
    yes = lambda v: "yes" if v else "no"
    for r in records:
        opt, ev = r.get("optimize") or {}, r.get("eval") or {}
        note = opt.get("message") or (ev.get("message") if ev.get("status") != "ok" else "") or ""
        if ev and ev.get("status") != "ok":
            note = f"eval {ev.get('status')}: {note}"
        wide = ev.get("float64") or {}
        if "new" in wide:   # off at 1e-4: which of the two is off from the float64 Model
            note = (f"against float64 Model: ModelNew {wide['new']:.1e}, Model {wide['model']:.1e} of the largest value"
                    + (f"; {note}" if note else ""))
        mode = f" ({r['compile_mode']})" if r.get("compile_mode") else ""
        out.append(f"| {r['task']} | {opt.get('status')} | {_f(opt.get('seconds'), 0)} | {opt.get('kernels')} / "
                   f"{opt.get('groups')} | {yes(r.get('correct_1e-2'))} | {yes(r.get('correct_1e-4'))} "
                   f"| {_e(ev.get('max_abs_err')) if ev.get('status') == 'ok' else '-'} | {yes(r.get('triton_kernel'))} "
                   f"| {_f(r.get('triton_share'), 2)} | {_f(r.get('new_ms'), 4)} | {_f(r.get('eager_ms'), 4)} "
                   f"| {_f(r.get('compile_ms'), 4)}{mode} "
                   f"| {_x(r.get('speedup_vs_eager'))} | {_x(r.get('speedup_vs_compile'))} | {_cell(note)} |")
    return out


def table(rows: list[dict]) -> str:
    return "\n".join(["## Per level", "", *level_table(by_level(rows)), "", NOTES, "## Per task", "",
                      *task_table(rows)]) + "\n"


def progress_line(i: int, n: int, r: dict) -> str:
    opt = r["optimize"]
    kernels = f", {opt['kernels']}/{opt['groups']} groups with a kernel" if opt.get("groups") is not None else ""
    parts = [f"[{i}/{n}] {r['task']}: optimize {opt['status']} ({opt['seconds']:.0f} s{kernels})"]
    ev = r.get("eval")
    if ev is None:
        parts.append("not evaluated")
    elif ev["status"] != "ok":
        parts.append(f"eval {ev['status']}")
    else:
        parts.append(f"correct {'yes' if r['correct_1e-2'] else 'no'} at 1e-2, {'yes' if r['correct_1e-4'] else 'no'} "
                     f"at 1e-4, our Triton {'yes' if r['triton_kernel'] else 'no'}")
    if r.get("speedup_vs_eager"):
        parts.append(f"{_x(r['speedup_vs_eager'])} vs eager, {_x(r['speedup_vs_compile'])} vs torch.compile")
    return "; ".join(parts) + f" ({r['seconds']:.0f} s)"


# -- the run ------------------------------------------------------------------------------------

def resolve_device(asked: str) -> str:
    """cpu hides the GPU from every child (optimize too); auto takes the GPU when there is one."""
    if asked == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return "cpu"
    import torch
    if torch.cuda.is_available():
        return "cuda"
    if asked == "cuda":
        raise SystemExit("--device cuda: no CUDA GPU is visible")
    return "cpu"


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def cluster_task(task: Task, opts: Options, baselines: tuple[dict, list[dict]] | None) -> tuple[dict, list[dict]]:
    """run_task in a cluster's worker: (its record, the baseline lines it measured); the
    client writes both, so the files have one writer as in a single-GPU run."""
    cache = BaselineCache(None, *baselines) if baselines else None
    return run_task(task, opts, cache), cache.added if cache else []


def run_all(tasks: list[Task], opts: Options, records_path: Path, results: Results, cache: BaselineCache | None,
            redo: bool, budget_s: float | None, engine: Engine | None = None, retry: bool = False,
            policy_data: Path | None = None) -> int:
    """Every task not yet recorded, one after another, or as tasks of `engine`'s cluster; on a GPU
    the measured drafts of each task's run join the policy's dataset in `policy_data`
    (bench.harvest)."""
    run = harvest.new_run()
    take_drafts = (lambda: _harvest(policy_data, run)) if policy_data and opts.device == "cuda" else (lambda: None)
    done = latest_records(records_path)
    unfinished = lambda rel: retry and (done[rel].get("optimize") or {}).get("status") in UNFINISHED
    todo = [t for t in tasks if redo or t.rel not in done or unfinished(t.rel)]
    order = lambda records: sorted(records.values(), key=lambda r: _order(r["task"]))
    where = engine.describe() if engine else opts.device
    print(f"{len(tasks)} task(s); {len(tasks) - len(todo)} already recorded in {records_path} (--redo runs them "
          f"again); {len(todo)} to run on {where}", flush=True)
    if done:
        results.save(order(done), levels=by_level(order(done)))
    start = time.monotonic()
    spent = lambda: budget_s is not None and time.monotonic() - start > budget_s

    def keep(i: int, record: dict) -> None:
        _append(records_path, record)
        done[record["task"]] = record
        print(progress_line(i, len(todo), record), flush=True)
        results.save(order(done), levels=by_level(order(done)))
        take_drafts()
    if engine is not None:
        n = _run_on(engine, todo, opts, cache, keep, spent)
        take_drafts()   # the workers' histories, merged into this host's log at the end
        return n
    for i, task in enumerate(todo, 1):
        if spent():
            print(f"budget of {budget_s:g} s spent: {len(todo) - i + 1} task(s) left; run again to continue", flush=True)
            break
        print(f"[{i}/{len(todo)}] {task.rel} ...", flush=True)
        keep(i, run_task(task, opts, cache))
    return len(todo)


def _harvest(policy_data: Path, run: str) -> None:
    from mtmc.tools.paths import home
    try:
        path, n = harvest.harvest([str(home())], policy_data, run)
    except Exception as e:   # the benchmark's records matter more than the policy's data
        print(f"policy data: not harvested ({type(e).__name__}: {e})", flush=True)
        return
    if n:
        print(f"policy data: {n} measured draft(s) -> {path}", flush=True)


def _run_on(engine: Engine, todo: list[Task], opts: Options, cache: BaselineCache | None, keep, spent) -> int:
    """The tasks as Dask tasks; records are kept here, in the client, as each comes back."""
    baselines = (cache.env, list(cache.entries.values())) if cache else None
    items = [(t.rel, (t, opts, baselines)) for t in todo]
    n = 0
    for n, got in enumerate(engine.map(cluster_task, items, stop=spent), 1):
        if got.error:
            print(f"[{n}/{len(todo)}] {got.key}: lost on all {got.attempts} tries ({got.error}); not recorded, "
                  f"a re-run tries it again", flush=True)
            continue
        record, lines = got.result
        for line in lines:
            if cache is not None:
                cache.keep(line)
        keep(n, {**record, "worker": got.worker, "attempts": got.attempts})
    if n < len(todo):
        print(f"budget spent: {len(todo) - n} task(s) left; run again to continue", flush=True)
    merged = merge_from_workers(engine)
    if merged:
        print(f"memory: {merged} histories from other hosts' logs merged into this one", flush=True)
    return len(todo)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.kernelbench", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", nargs="?", default=str(DEFAULT_FOLDER), help="folder with level1/, level2/ ... task files")
    p.add_argument("--levels", type=int, nargs="+", help="only these levels")
    p.add_argument("--only", nargs="+", help="only tasks whose path contains one of these (or matches a glob)")
    p.add_argument("--limit", type=int, help="at most this many tasks (after --levels and --only)")
    p.add_argument("--out", help="name of the records and tables (default: FOLDER name and GPU)")
    p.add_argument("--results-dir", default=str(REPO / "bench" / "results"))
    p.add_argument("--redo", action="store_true", help="run tasks already recorded under --out again")
    p.add_argument("--retry", action="store_true",
                   help="run again the recorded tasks whose optimize timed out or crashed")
    p.add_argument("--timeout", type=float, default=300.0, help="wall seconds of one `mtmc optimize`")
    p.add_argument("--eval-timeout", type=float, default=600.0, help="wall seconds of one task's evaluation")
    p.add_argument("--compile-timeout", type=float, default=600.0, help="wall seconds of one baseline (one mode)")
    p.add_argument("--max-steps", type=int, help="passed to mtmc optimize")
    p.add_argument("--target", help="passed to mtmc optimize")
    p.add_argument("--cuda-graph", action="store_true", help="passed to mtmc optimize (the CUDA-graph replay action)")
    p.add_argument("--allow-tf32", action="store_true",
                   help="passed to mtmc optimize (TF32 products in fp32 conv / matmul groups); records named ...-tf32")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--trials", type=int, default=3, help="fresh input sets in the correctness check")
    p.add_argument("--budget", type=float, help="start no task after this many seconds (for time-limited calls)")
    p.add_argument("--save-new", help="keep each NEW.py under this folder")
    # max-autotune compiles for minutes per module: a time-limited call may measure default only
    p.add_argument("--compile-modes", nargs="+", choices=COMPILE_MODES, default=list(COMPILE_MODES),
                   help="torch.compile modes to time (the faster one is the baseline)")
    p.add_argument("--policy-data", default=str(REPO / "bench" / "data" / "policy"),
                   help="on a GPU, the measured drafts of every run join the policy's dataset here ('' for none)")
    add_cluster_args(p)
    return p.parse_args(argv)


def gpu_slug(gpu: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100': the records' default name, one per kind of GPU, so runs
    on an H100 never land in the H200's table (the device tool may give either)."""
    model = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", gpu)
    return model.group(1).lower() if model else re.sub(r"\W+", "_", gpu).strip("_").lower()


def main(argv=None) -> int:
    args = parse_args(argv)
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"no task folder {folder}", file=sys.stderr)
        return 2
    device = resolve_device(args.device)
    tasks = find_tasks(folder, args.levels, args.only, args.limit)
    opts = Options(device, args.timeout, args.eval_timeout, args.compile_timeout, args.max_steps, args.target,
                   args.trials, Path(args.save_new) if args.save_new else None, tuple(args.compile_modes),
                   args.cuda_graph, args.allow_tf32)
    meta = run_meta(folder=str(folder), device=device, **{k: v for k, v in dataclasses.asdict(opts).items()
                                                         if k != "device"})
    name = args.out or (f"{folder.resolve().name}-{'cpu' if device == 'cpu' else gpu_slug(meta['gpu'])}"
                        + ("-tf32" if args.allow_tf32 else ""))   # never mixed with the default's records
    results = Results(args.results_dir, name, "kernelbench", f"KernelBench: {folder.resolve().name}", table, meta)
    cache = BaselineCache(results.dir / "kernelbench-baselines.jsonl", meta) if device == "cuda" else None
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)   # so the children are killed on the way out
    try:
        with open_engine(args, cpu_only=device == "cpu") as engine:
            run_all(tasks, opts, results.dir / f"{name}.jsonl", results, cache, args.redo, args.budget, engine,
                    retry=args.retry, policy_data=Path(args.policy_data) if args.policy_data else None)
    except KeyboardInterrupt:
        print("interrupted: the finished tasks are recorded; run again to continue", file=sys.stderr)
        return 130
    print(f"records: {results.dir / name}.jsonl; tables: {results.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
