"""Collect the policy's measurement dataset: many configs of many specs, timed on this GPU.

  python -m bench.collect [--families all|matmul,conv,...] [--budget-s 480] [--specs-per-family 24]
                          [--configs-per-spec 24] [--exhaustive-heldout 200] [--workers 14] [--cpu]
                          [--out bench/data/policy] [--seed 0] [--plan]

Specs and configs come from bench.collect_specs (every catalog family, the same number each).
A spawned pool renders and compiles the configs of the next specs offline for this GPU's target at
the spec's real dims (their resources) while one measuring process times the current spec's
(bench.collect_workers):
inputs and float64 truth once per spec, then per config one checked launch and do_bench's median.
Configs the resource model masks are recorded as "masked" unmeasured, except a seeded 5 %.
Each spec's rows are appended to bench/data/policy/<date>-<gpu>-<run>.jsonl.gz at once
(mtmc.policy.dataset), so a run cut short keeps them, and a later run skips what this GPU has.
No new spec starts when the budget is near; the summary counts rows by family and stage.
--gpus N (a local Dask cluster, one worker per GPU) or --scheduler ADDR splits the specs into one
shard per GPU worker (mtmc.tools.cluster); each shard runs this command on its worker's GPU with
its share of the compile workers and writes its own run file; a lost shard runs again and resumes.
--cpu (and no GPU) runs the same in Triton's interpreter at the families' small check dims,
unmeasured.  --plan prints what a run would measure within the budget, compiling nothing.
Imports only torch, triton, numpy and mtmc's kernels / tools / policy / request: it runs on a GPU
machine without the agent's other dependencies.
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import platform
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.collect_specs import MAX_BYTES, SpecEntry, all_specs, configs_for, masked, sample_masked
from bench.collect_workers import Measurer, compile_job, pool_init
from mtmc.kernels.catalog import describe, families, family_of
from mtmc.policy import dataset
from mtmc.policy.actions import config_key

ROOT = Path(__file__).resolve().parents[1]
# --plan's rates (seconds), guesses until a run prints its own: one config's check + do_bench on
# the GPU, one offline compile on one core
PLAN_MEASURE_S, PLAN_COMPILE_S = 0.08, 1.2
DEADLINE_GRACE_S = 30.0   # a spec still measuring this long after the budget is cut short


def profile_key(hw) -> str:
    """The hardware profile's short name ("h200"), or the device's name made a token."""
    return profile_key_of(hw.name)


def profile_key_of(name: str) -> str:
    """profile_key for a GPU's name (a history's profile dict keeps only that)."""
    from mtmc.tools.hardware import PROFILES, get_profile
    try:
        prof = get_profile(name)
        return next(k for k, p in PROFILES.items() if p is prof)
    except (ValueError, StopIteration):
        return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch
    try:
        triton = version("triton")
    except PackageNotFoundError:
        triton = None
    commit = os.environ.get("MTMC_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                    timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {"torch": torch.__version__, "triton": triton, "python": platform.python_version(), "mtmc_commit": commit}


@dataclass
class Prepared:
    """One spec on its way: the rows known without measuring, and the compiles in flight."""
    entry: SpecEntry
    index: int
    rows: list[dict] = field(default_factory=list)
    compiles: list[tuple[dict, bool, dict, object]] = field(default_factory=list)  # config, legal, dims, AsyncResult


class Collector:
    def __init__(self, args, device_name: str | None, hw, gpu: str, done: set):
        """device_name: torch's name of the GPU that measures, or None: the interpreter, unmeasured."""
        self.args, self.on_gpu, self.hw, self.gpu, self.done = args, device_name is not None, hw, gpu, done
        self.run_id = secrets.token_hex(4)
        self.date = dt.datetime.now(dt.timezone.utc).date().isoformat()
        self.meta = {"gpu": gpu, "device_name": device_name or "cpu", "date": self.date, "versions": versions(),
                     "run": self.run_id}
        token = gpu if self.on_gpu else "cpu"
        self.path = Path(args.out) / dataset.file_name(self.date, token, self.run_id)
        self.counts: collections.Counter = collections.Counter()
        self.measured = self.restarts = 0
        self._pool = None
        self.start = time.monotonic()

    # -- rows -----------------------------------------------------------------------------
    def row(self, entry: SpecEntry, config: dict, resources: dict | None, legal: bool, stage: str,
            error: str | None = None, ms: float | None = None) -> dict:
        spec = {k: v for k, v in entry.spec.to_dict().items() if k != "request"}
        return dataset.Record(spec=spec, spec_key=entry.spec.key(), family=entry.spec.family, config=config,
                              config_key=config_key(config), resources=resources or dataset.no_resources(),
                              legal=legal, stage=stage, error=error, ms=ms,
                              measured=bool(self.on_gpu and stage == "ok" and ms is not None),
                              set=entry.set, **self.meta).to_dict()

    # -- one spec -------------------------------------------------------------------------
    def pool(self):
        """The compile pool, started on first use (a run with nothing left to do starts none)."""
        if self._pool is None:
            import multiprocessing as mp
            old = os.environ.pop("TRITON_INTERPRET", None)   # its workers compile for the target
            try:
                self._pool = mp.get_context("spawn").Pool(self.args.workers, initializer=pool_init,
                                                          maxtasksperchild=200)
            finally:
                if old is not None:
                    os.environ["TRITON_INTERPRET"] = old
        return self._pool

    def prepare(self, entry: SpecEntry, index: int) -> Prepared:
        """Choose the spec's configs; record masked ones; start compiling the rest."""
        a, spec = self.args, entry.spec
        prep = Prepared(entry, index)
        fam = family_of(spec)
        for cfg in configs_for(entry, self.hw, a.configs_per_spec, a.exhaustive_heldout, a.seed, a.max_configs):
            ck = config_key(cfg)
            if (spec.key(), ck, self.gpu) in self.done:
                continue
            why = masked(spec, cfg, self.hw)
            if why and not sample_masked(spec.key(), ck, a.seed):
                prep.rows.append(self.row(entry, cfg, None, False, "masked", why[:300]))
                continue
            # compiled at the real dims (placeholders are never touched): the small check dims can
            # specialize differently (other registers for reductions, norms, convs), and on a GPU the
            # launch then finds this very compile in Triton's cache
            dims = spec.dims if self.on_gpu else fam.check_dims(spec, cfg)
            job = self.pool().apply_async(compile_job, (spec.to_dict(), cfg, spec.dims, self.hw.to_dict()))
            prep.compiles.append((cfg, why is None, dims, job))
        return prep

    def finish(self, prep: Prepared, measurer: Measurer, deadline: float) -> list[dict]:
        """Wait for the spec's compiles, measure what compiled, and return all its rows."""
        entry, rows = prep.entry, list(prep.rows)
        items, by_key = [], {}
        for cfg, legal, dims, job in prep.compiles:
            try:
                res = job.get(timeout=self.args.compile_timeout_s)
            except Exception as e:   # multiprocessing.TimeoutError, or the worker died
                res = {"source": None, "resources": None, "error": f"compile: {type(e).__name__}: {e}"[:300]}
            if res["error"]:
                rows.append(self.row(entry, cfg, res["resources"], False, "compile_error", res["error"]))
                continue
            key = config_key(cfg)
            by_key[key] = (cfg, legal, res["resources"])
            items.append({"key": key, "source": res["source"], "dims": dict(dims)})
        if items:
            results, why = measurer.measure(entry.spec.to_dict(), items, deadline)
            self.measured += len(results)
            if why:
                print(f"  {len(items) - len(results)} configs left unmeasured: {why}", flush=True)
            for key, r in results.items():
                cfg, legal, resources = by_key[key]
                rows.append(self.row(entry, cfg, resources, legal, r["stage"], r.get("error"), r.get("ms")))
        return rows

    def per_config_s(self) -> float:
        """Wall seconds per compiled config so far (compiles, waits and measuring), or a guess."""
        if self.measured >= 20:
            return (time.monotonic() - self.start) / self.measured
        return PLAN_MEASURE_S if self.on_gpu else 3.0

    # -- the run --------------------------------------------------------------------------
    def run(self, entries: list[SpecEntry]) -> int:
        a = self.args
        start = self.start = time.monotonic()
        budget_end, deadline = start + a.budget_s, start + a.budget_s + DEADLINE_GRACE_S
        measurer = Measurer("cuda" if self.on_gpu else "cpu", interpret=not self.on_gpu,
                            item_timeout_s=a.config_timeout_s, setup_timeout_s=a.setup_timeout_s,
                            warmup_ms=a.warmup_ms, rep_ms=a.rep_ms)
        print(f"collecting {len(entries)} specs on {self.meta['device_name']} ({self.gpu}) for {a.budget_s:g} s "
              f"with {a.workers} compile workers -> {self.path}", flush=True)
        ahead: collections.deque[Prepared] = collections.deque()
        todo = iter(enumerate(entries))
        stopped = None
        try:
            while True:
                # keep the pool busy: compiles of the next specs run while this one is measured
                while len(ahead) < 2 or sum(len(p.compiles) for p in ahead) < 3 * a.workers:
                    nxt = next(todo, None)
                    if nxt is None:
                        break
                    ahead.append(self.prepare(nxt[1], nxt[0]))
                if not ahead:
                    break
                prep = ahead.popleft()
                if not prep.rows and not prep.compiles:
                    continue   # every config of this spec is already in the dataset
                need = len(prep.compiles) * self.per_config_s()
                if time.monotonic() + need > budget_end:
                    stopped = f"the budget is near ({a.budget_s:g} s)"
                    break
                rows = self.finish(prep, measurer, deadline)
                dataset.append(self.path, rows)
                self.report(prep, rows, start, len(entries))
        except KeyboardInterrupt:
            stopped = "interrupted"
        finally:
            if self._pool is not None:
                self._pool.terminate()
            self.restarts = measurer.restarts
            measurer.stop()
        self.summary(start, stopped)
        return 0

    def report(self, prep: Prepared, rows: list[dict], start: float, total: int) -> None:
        stages = collections.Counter(r["stage"] for r in rows)
        self.counts.update((r["family"], r["stage"]) for r in rows)
        elapsed = time.monotonic() - start
        ok_ms = sorted(r["ms"] for r in rows if r["ms"] is not None)
        best = f", best {ok_ms[0]:.4g} ms" if ok_ms else ""
        print(f"[{prep.index + 1}/{total} {elapsed:6.1f}s] {prep.entry.set:<7} {describe(prep.entry.spec)}: "
              + " ".join(f"{k} {v}" for k, v in sorted(stages.items())) + best
              + f" ({self.measured / max(elapsed, 1e-9):.1f} configs/s)", flush=True)

    def summary(self, start: float, stopped: str | None) -> None:
        elapsed = time.monotonic() - start
        fams = sorted({f for f, _ in self.counts})
        print(f"\n{'stopped: ' + stopped if stopped else 'done'}; {sum(self.counts.values())} rows in {elapsed:.0f} s, "
              f"{self.measured} configs measured ({self.measured / max(elapsed, 1e-9):.1f}/s), "
              f"{self.restarts} fresh measuring processes -> {self.path}")
        print(f"{'family':<12}" + "".join(f"{s:>14}" for s in dataset.STAGES))
        for f in fams:
            print(f"{f:<12}" + "".join(f"{self.counts[f, s]:>14}" for s in dataset.STAGES))

# -- --plan ---------------------------------------------------------------------------------
def plan(entries: list[SpecEntry], args, hw, gpu: str, done: set) -> int:
    """What a run would do within the budget: specs and configs per family, no compile."""
    rate = max(PLAN_MEASURE_S, PLAN_COMPILE_S / max(1, args.workers))
    per = collections.defaultdict(collections.Counter)
    used, fit = 0.0, 0
    full = False   # a run stops at the first spec that does not fit
    for entry in entries:
        spec, c = entry.spec, per[entry.spec.family]
        n = 0
        for cfg in configs_for(entry, hw, args.configs_per_spec, args.exhaustive_heldout, args.seed, args.max_configs):
            ck = config_key(cfg)
            if (spec.key(), ck, gpu) in done:
                c["done"] += 1
                continue
            c["configs"] += 1
            if masked(spec, cfg, hw) and not sample_masked(spec.key(), ck, args.seed):
                c["masked"] += 1
            else:
                n += 1
        c["specs"] += 1
        c[entry.set] += 1
        c["to_run"] += n
        full = full or used + n * rate > args.budget_s
        if not full:
            used += n * rate
            fit += 1
            c["in_budget"] += n
    cols = ("specs", "train", "heldout", "configs", "masked", "to_run", "in_budget", "done")
    print(f"{'family':<12}" + "".join(f"{k:>10}" for k in cols))
    for fam in sorted(per):
        print(f"{fam:<12}" + "".join(f"{per[fam][k]:>10}" for k in cols))
    total = collections.Counter()
    for c in per.values():
        total.update(c)
    print(f"{'all':<12}" + "".join(f"{total[k]:>10}" for k in cols))
    print(f"\nat ~{rate:.3f} s per config (max of {PLAN_MEASURE_S} s measuring and {PLAN_COMPILE_S} s compiling "
          f"over {args.workers} workers; a run prints its real configs/s) a budget of {args.budget_s:g} s "
          f"covers about {fit} of {len(entries)} specs, {total['in_budget']} of {total['to_run']} configs to "
          f"compile and measure; the whole plan needs about {total['to_run'] * rate:.0f} s")
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.collect", description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default="all", help="all, or a comma list of catalog families")
    p.add_argument("--budget-s", type=float, default=480.0)
    p.add_argument("--specs-per-family", type=int, default=24)
    p.add_argument("--configs-per-spec", type=int, default=24, help="random configs per train spec "
                   "(beside the default and its one-knob neighbours)")
    p.add_argument("--exhaustive-heldout", type=int, default=200, help="a held-out spec's whole config "
                   "product when it has at most this many, else this many random ones")
    p.add_argument("--max-configs", type=int, default=None, help="at most this many configs per spec (quick runs)")
    p.add_argument("--max-gib", type=float, default=MAX_BYTES / 2**30, help="cap on a spec's tensor bytes")
    p.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    p.add_argument("--cpu", action="store_true", help="Triton's interpreter at small dims, unmeasured")
    p.add_argument("--out", default=str(dataset.DEFAULT_DIR))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan", action="store_true", help="print what a run would measure; compile nothing")
    p.add_argument("--config-timeout-s", type=float, default=None, help="per config (default 30 on a GPU, "
                   "300 in the interpreter)")
    p.add_argument("--setup-timeout-s", type=float, default=300.0, help="a spec's inputs and float64 truth")
    p.add_argument("--compile-timeout-s", type=float, default=120.0)
    p.add_argument("--warmup-ms", type=float, default=5.0)
    p.add_argument("--rep-ms", type=float, default=25.0)
    g = p.add_argument_group("scale-out on Dask: the specs split into one shard per GPU worker")
    g.add_argument("--gpus", type=int, help="a local Dask cluster of this many workers, one per GPU "
                   "(CPU workers with --cpu); each runs one shard of the specs")
    g.add_argument("--scheduler", help="an existing Dask scheduler (tcp://host:8786): one shard per GPU worker")
    g.add_argument("--retries", type=int, default=2, help="new tries of a shard whose worker died")
    g.add_argument("--shard", help="I/N: only every N-th spec from the I-th (what a cluster's worker runs)")
    return p.parse_args(argv)


# -- many GPUs ------------------------------------------------------------------------------------

SHARD_DROPS = ("--gpus", "--scheduler", "--retries", "--workers", "--shard")   # options a shard gets anew


def shard_argv(argv: list[str], i: int, n: int, workers: int) -> list[str]:
    """The command line of shard i of n: the run's own, without the cluster's options, with its
    share of the compile workers (the shards share the host's cores)."""
    out, rest = [], iter(argv)
    for a in rest:
        if a.split("=", 1)[0] not in SHARD_DROPS:
            out.append(a)
        elif "=" not in a:
            next(rest, None)   # "--gpus 8": its value goes too
    return [*out, "--workers", str(workers), "--shard", f"{i}/{n}"]


def run_shard(argv: list[str]) -> dict:
    """One shard in a cluster's worker: `python -m bench.collect ...` on the worker's GPU (its
    CUDA_VISIBLE_DEVICES is the worker's); it writes its own run file, so no two writers share one."""
    proc = subprocess.run([sys.executable, "-m", "bench.collect", *argv], cwd=ROOT, capture_output=True, text=True)
    return {"rc": proc.returncode, "tail": (proc.stdout + proc.stderr)[-1500:]}


def run_on_cluster(args, argv: list[str]) -> int:
    """Every shard as a Dask task (a lost one runs again, resuming from what its files hold)."""
    from mtmc.tools.cluster import ClusterOptions, Engine
    with Engine.open(ClusterOptions(args.gpus, args.scheduler, args.retries, cpu_only=args.cpu)) as engine:
        print(engine.describe(), flush=True)
        gpu = engine.gpu_workers() > 0
        n = max(1, engine.slots(gpu))
        per = max(1, args.workers // n) if args.scheduler is None else args.workers
        items = [(f"shard {i}/{n}", (shard_argv(argv, i, n, per),)) for i in range(n)]
        failed = 0
        for done in engine.map(run_shard, items, gpu=gpu):
            ok = done.error is None and done.result["rc"] == 0
            failed += not ok
            why = done.error or done.result["tail"].strip().splitlines()[-1:]
            print(f"[{done.key}] {'done' if ok else 'FAILED'} on {done.worker} after {done.attempts} tr"
                  f"{'y' if done.attempts == 1 else 'ies'}: {why}", flush=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    import torch

    from mtmc.tools.hardware import PROFILES, resolve
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if (args.gpus or args.scheduler) and not args.plan:
        return run_on_cluster(args, argv)
    on_gpu = torch.cuda.is_available() and not args.cpu
    if args.config_timeout_s is None:
        args.config_timeout_s = 30.0 if on_gpu else 300.0
    hw = resolve("auto") if on_gpu else PROFILES["h200"]
    gpu = profile_key(hw)
    names = list(families()) if args.families == "all" else [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = sorted(set(names) - set(families()))
    if unknown:
        print(f"unknown families {', '.join(unknown)}; the catalog has {', '.join(families())}", file=sys.stderr)
        return 2
    entries = all_specs(names, args.specs_per_family, args.seed, int(args.max_gib * 2**30))
    if args.shard:
        i, n = (int(v) for v in args.shard.split("/"))
        entries = entries[i::n]
    # resume from this run's folder and the repository's dataset (a device run writes elsewhere)
    folders = {Path(p).resolve() for p in (args.out, dataset.DEFAULT_DIR)}
    done = dataset.done_keys(dataset.load(sorted(folders)), gpu, on_cpu=not on_gpu)
    if args.plan:
        return plan(entries, args, hw, gpu, done)
    return Collector(args, torch.cuda.get_device_name(0) if on_gpu else None, hw, gpu, done).run(entries)


if __name__ == "__main__":
    sys.exit(main())
