"""bench.collect's child work: the compile pool's job, and the measuring process with its keeper.

compile_job (in a spawned pool): render one config and compile it offline for the target with
tools.target_compile (kernels.task.compile_resources), reduced to the dataset's resources.

The measuring process (one at a time, `Measurer` starts it): per spec, inputs drawn once on the
device and the float64 truth computed once (tools.correctness), then per compiled config: load
the source, launch once, judge against the truth, check the inputs are unchanged, and time it
with do_bench (tools.timing.bench_ms; short warmup and rep) on a GPU (a config slower than
SLOW_MS a run: that one run, by CUDA events).  Without one the same runs
in Triton's interpreter at the family's small check dims, untimed.  A config that hangs is cut by
a per-config time limit, and one that breaks the CUDA context ends the process: either way the
keeper records it and starts a fresh process for the spec's remaining configs.
"""
from __future__ import annotations

import os
import time

BLOCKING = ("smem_overflow", "too_many_regs", "compile_error")
# exception types that mean the kernel could not be built for (or launched on) the device
COMPILE_ERRORS = ("CompilationError", "OutOfResources", "PTXASError", "MLIRCompilationError")
KEEP_DIMS = 4   # interpreter runs: input sets kept per spec (one per distinct check dims)
# A config whose first launch took this long is timed once more on its own; if that run alone
# takes SLOW_MS, it is the time (do_bench's dozen runs would spend the config's time limit).
SLOW_FIRST_S, SLOW_MS = 0.5, 200.0


def short(e: BaseException | str, limit: int = 300) -> str:
    text = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) > 1:   # Triton's compile errors put the reason last, after the source
        return f"{lines[0]} ... {lines[-1]}"[:limit]
    return (lines[0] if lines else text)[:limit]


# -- compile pool -------------------------------------------------------------------------
def pool_init() -> None:
    """A compile worker compiles for the target: Triton must not be the interpreter here.  It
    yields the CPU to the measuring process, whose launches must not wait for a core (do_bench's
    events would count the gap)."""
    os.environ.pop("TRITON_INTERPRET", None)
    try:
        os.nice(10)
    except OSError:
        pass


def compile_job(spec: dict, config: dict, dims: dict, profile: dict) -> dict:
    """{"source", "resources", "error"}: error (short text) when rendering or compiling fails or
    the compiled kernel breaks a hard limit (shared memory, registers per SM)."""
    from mtmc.kernels.catalog import family_of
    from mtmc.kernels.spec import KernelSpec
    from mtmc.kernels.task import compile_resources
    from mtmc.policy.dataset import no_resources, resources_of
    from mtmc.tools.hardware import HardwareProfile
    ks = KernelSpec.from_dict(spec)
    try:
        source = family_of(ks).render(ks, config)
    except Exception as e:
        return {"source": None, "resources": no_resources(), "error": "render: " + short(e)}
    try:
        report = compile_resources(source, ks, dims, HardwareProfile(**profile)).to_dict()
    except Exception as e:   # the launch wrapper's own Python failed
        return {"source": source, "resources": no_resources(), "error": short(e)}
    blocking = [v for v in report["violations"] if v.get("kind") in BLOCKING]
    error = short(f"{blocking[0]['kind']}: {blocking[0].get('detail', '')}") if blocking else None
    if not report["kernels"]:
        error = "launch() started no kernel"
    return {"source": source, "resources": resources_of(report), "error": error}


# -- the measuring process ----------------------------------------------------------------
class SpecBench:
    """One spec's inputs (drawn once per dims), float64 truth and per-config measurement."""

    def __init__(self, spec: dict, device: str, warmup_ms: float, rep_ms: float):
        from mtmc.kernels.spec import KernelSpec
        from mtmc.kernels.task import task_of
        from mtmc.tools.correctness import reference_namespace
        self.task = task_of(KernelSpec.from_dict(spec))
        self.ns = reference_namespace(self.task)
        self.device, self.warmup_ms, self.rep_ms = device, warmup_ms, rep_ms
        self.sets: dict[tuple, tuple] = {}

    def inputs(self, dims: dict):
        """(inputs, their pristine copies, judge) at `dims`, made on first use."""
        from mtmc.tools.correctness import make_inputs, truth_judge
        key = tuple(sorted(dims.items()))
        if key not in self.sets:
            if len(self.sets) >= KEEP_DIMS:
                self.sets.pop(next(iter(self.sets)))
            xs = make_inputs(self.task, dims, self.device)
            self.sets[key] = (xs, [x.clone() for x in xs], truth_judge(self.ns, self.task, xs, self.device))
        return self.sets[key]

    def _sync(self) -> None:
        import torch
        if self.device == "cuda":
            torch.cuda.synchronize()

    def _failed(self, e: BaseException, where: str) -> dict:
        stage = "compile_error" if type(e).__name__ in COMPILE_ERRORS else "wrong"
        return {"stage": stage, "error": short(f"{where}: {short(e)}"), "ms": None, "poisoned": self.broken()}

    def broken(self) -> bool:
        """Has a CUDA error poisoned this process's context (every later launch would fail)?"""
        if self.device != "cuda":
            return False
        import torch
        try:
            torch.cuda.synchronize()
            return float(torch.ones(1, device="cuda").sum()) != 1.0
        except Exception:
            return True

    def measure(self, source: str, dims: dict) -> dict:
        """{"stage": "ok" | "wrong" | "compile_error", "error", "ms", "poisoned"}."""
        import torch

        from mtmc.tools.correctness import poisoned_output
        from mtmc.tools.loader import load_source
        from mtmc.tools.timing import bench_ms
        xs, pristine, judge = self.inputs(dims)
        try:
            launch = load_source(source, "candidate").launch
            out = poisoned_output(self.task, dims, self.device)
            first = time.perf_counter()
            launch(*xs, out=out)
            self._sync()
            first = time.perf_counter() - first
        except Exception as e:
            return self._failed(e, "launch")
        try:
            ok, reason, _, _ = judge(out)
        except Exception as e:
            return self._failed(e, "judging")
        changed = [i for i, (x, x0) in enumerate(zip(xs, pristine)) if not torch.equal(x, x0)]
        for i in changed:   # the next configs need the inputs as drawn
            xs[i].copy_(pristine[i])
        if changed or not ok:
            return {"stage": "wrong", "error": short(f"input {changed[0]} was modified" if changed else reason),
                    "ms": None, "poisoned": False}
        if self.device != "cuda":
            return {"stage": "ok", "error": None, "ms": None, "poisoned": False}
        try:
            ms = once_ms(lambda: launch(*xs, out=out)) if first > SLOW_FIRST_S else None
            if ms is None or ms < SLOW_MS:
                ms = bench_ms(lambda: launch(*xs, out=out), self.warmup_ms, self.rep_ms)
        except Exception as e:
            return self._failed(e, "timing")
        return {"stage": "ok", "error": None, "ms": ms, "poisoned": False}


def once_ms(fn) -> float:
    """One run's GPU time by CUDA events (for configs too slow for do_bench's many runs)."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def serve(conn, device: str, interpret: bool, warmup_ms: float, rep_ms: float) -> None:
    """The measuring process: jobs {"spec", "items": [{"key", "source", "dims"}]} in, then
    ("ready",) or ("setup_error", text), one ("row", key, row) per item and ("done",) out; it
    exits after a row whose CUDA error poisoned the context (("poisoned",) said first)."""
    if interpret:   # before Triton is imported: it reads this at import and @jit time
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    import torch
    import triton.language  # noqa: F401  (imported now, so no config's time limit pays for it)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            bench = SpecBench(job["spec"], device, warmup_ms, rep_ms)
            if device == "cuda":   # every config runs at the spec's own dims: draw them now
                bench.inputs(job["items"][0]["dims"])
        except Exception as e:
            conn.send(("setup_error", short(e)))
            continue
        conn.send(("ready",))
        for item in job["items"]:
            row = bench.measure(item["source"], item["dims"])
            poisoned = row.pop("poisoned", False)
            conn.send(("row", item["key"], row))
            if poisoned:
                conn.send(("poisoned",))
                conn.close()
                os._exit(3)
        del bench
        if device == "cuda":
            torch.cuda.empty_cache()
        conn.send(("done",))


class Measurer:
    """Keeps one measuring process and measures a spec's compiled configs in it, surviving
    configs that hang (killed after item_timeout_s: stage "timeout"), crash the process or poison
    the CUDA context (stage "wrong"), by starting a fresh process for the rest."""

    def __init__(self, device: str, interpret: bool, item_timeout_s: float, setup_timeout_s: float,
                 warmup_ms: float = 5.0, rep_ms: float = 25.0):
        self.args = (device, interpret, warmup_ms, rep_ms)
        self.item_timeout_s, self.setup_timeout_s = item_timeout_s, setup_timeout_s
        self.proc = self.conn = None
        self.restarts = 0

    def _start(self) -> None:
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child, *self.args), daemon=True)
        self.proc.start()
        child.close()

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if not kill:
            try:
                self.conn.send(None)
                self.proc.join(10)
            except (OSError, ValueError):
                pass
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)
        self.conn.close()
        self.proc = self.conn = None

    def _receive(self, timeout_s: float):
        """The next message, "timeout", or "died" (the process ended without a word)."""
        try:
            if not self.conn.poll(max(0.0, timeout_s)):
                return ("timeout",)
            return self.conn.recv()
        except (EOFError, OSError):
            return ("died",)

    def _lost(self) -> None:
        """The process is stuck, dead or poisoned: end it; the next job starts a fresh one."""
        self.stop(kill=True)
        self.restarts += 1

    def measure(self, spec: dict, items: list[dict], deadline: float | None = None) -> tuple[dict, str | None]:
        """({item key: {"stage", "error", "ms"}}, why the rest went unmeasured or None)."""
        rows: dict[str, dict] = {}
        todo = list(items)
        setup_failures = 0
        while todo:
            if self.proc is None:
                self._start()
            try:
                self.conn.send({"spec": spec, "items": todo})
                msg = self._receive(self.setup_timeout_s)
            except (OSError, ValueError):   # it died between specs
                msg = ("died",)
            if msg[0] == "setup_error":   # the spec's own inputs or truth failed; the process is fine
                return rows, f"setting up the spec: {msg[1]}"
            if msg[0] != "ready":
                self._lost()
                setup_failures += 1
                if setup_failures >= 2:
                    return rows, f"setting up the spec: the measuring process {msg[0]} twice"
                continue
            while True:   # until "done", or the process is lost (a fresh one takes the rest)
                left = self.item_timeout_s if deadline is None else min(self.item_timeout_s, deadline - time.monotonic())
                msg = self._receive(left)
                if msg[0] == "row":
                    rows[msg[1]] = msg[2]
                    todo = [t for t in todo if t["key"] != msg[1]]
                    continue
                if msg[0] == "done":
                    break
                if msg[0] == "poisoned":
                    self._lost()
                elif msg[0] == "timeout" and deadline is not None and time.monotonic() >= deadline:
                    self._lost()
                    return rows, "the time budget ran out"
                elif msg[0] == "timeout" and todo:
                    rows[todo.pop(0)["key"]] = {"stage": "timeout", "ms": None,
                                                "error": f"no result within {self.item_timeout_s:g} s"}
                    self._lost()
                elif msg[0] == "died" and todo:
                    self.proc.join(5)
                    code = self.proc.exitcode
                    rows[todo.pop(0)["key"]] = {"stage": "wrong", "ms": None,
                                                "error": f"the measuring process died (exit code {code})"}
                    self._lost()
                else:
                    self._lost()
                break
        return rows, None
