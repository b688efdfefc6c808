"""The scale-out engine: independent tasks (benchmark tasks, modules to optimize) on Dask.

Everything that knows Dask is in this module, so another engine (Ray) could stand beside it.

  with Engine.open(ClusterOptions(workers=4)) as engine:   # or scheduler="tcp://host:8786"
      for done in engine.map(fn, [(key, args), ...]):      # in the order they finish
          ...                                               # the caller alone writes files

Workers: a LocalCluster-like SpecCluster with one worker process per GPU (CUDA_VISIBLE_DEVICES
pinned per worker and a "GPU" resource of 1, so a task asking for a GPU gets a whole one), or
CPU-only workers where no GPU is visible; or an existing scheduler by address, whose workers
should be started the same way (`CUDA_VISIBLE_DEVICES=i dask worker ADDR --nthreads 1
--resources GPU=1`).  One thread per worker: a task owns its worker (and its GPU).

Failures: a worker that dies (killed, out of memory) or a task still running after
`hang_s` (its worker process is killed, and its nanny starts a new one) loses only that task; the task is submitted again, to
whichever worker is free, up to `retries` more times, and is then given up (Done.error).  A
result is handed out once per key, so a task that finished just before its worker died is not
counted twice.  dask and distributed are imported only when an engine opens.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator

GPU = "GPU"   # the worker resource a GPU task asks one of
POLL_S = 1.0  # how often the client looks for hung tasks while it waits


@dataclasses.dataclass
class ClusterOptions:
    workers: int | None = None     # local worker processes (default: one per visible GPU, else 2)
    scheduler: str | None = None   # an existing scheduler's address instead of a local cluster
    retries: int = 2               # new tries for a task whose worker died or hung
    hang_s: float | None = None    # a task running longer than this restarts its worker (None: never)
    env: dict = dataclasses.field(default_factory=dict)   # set in every task (e.g. MTMC_CHROMA_HOST)
    dashboard: str = ":0"          # the local scheduler's dashboard address (":0": any free port)
    cpu_only: bool = False         # CPU workers even where GPUs are visible (a --device cpu run)


@dataclasses.dataclass
class Done:
    key: str
    result: object = None
    error: str | None = None       # set when every try failed: why the last one did
    attempts: int = 1
    worker: str | None = None


SCHEDULER_ENV = "MTMC_SCHEDULER"   # the chat's status tab shows this cluster (tcp://host:8786)


def cluster_status(address: str | None = None, timeout_s: float = 3.0) -> str | None:
    """One line on the configured cluster for the chat's status tab: its workers, GPUs and
    dashboard, or why it cannot be reached; None when no cluster is configured."""
    address = address or os.environ.get(SCHEDULER_ENV, "").strip() or None
    if not address:
        return None
    try:
        from distributed import Client
        client = Client(address, timeout=timeout_s)
    except ImportError:
        return f"Dask: {address} is configured, but distributed is not installed here"
    except Exception as exc:   # refused, timed out, a wrong address: said, not raised into the UI
        return f"Dask: {address} cannot be reached ({type(exc).__name__}: {str(exc)[:120]})"
    try:
        return Engine(client, None, ClusterOptions(scheduler=address)).describe()
    finally:
        client.close()


def visible_gpus() -> list[str]:
    """The GPU ids a local cluster pins its workers to: CUDA_VISIBLE_DEVICES when set (empty:
    none), else what nvidia-smi lists; none without a driver."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return out.stdout.split() if out.returncode == 0 else []


def worker_specs(opts: ClusterOptions) -> dict[str, dict]:
    """One Nanny-managed single-thread worker per GPU (pinned, GPU resource 1), or `workers`
    CPU workers (no GPU visible to them)."""
    from distributed import Nanny
    gpus = [] if opts.cpu_only else visible_gpus()
    if gpus:
        if opts.workers is not None and opts.workers > len(gpus):
            raise ValueError(f"{opts.workers} GPU workers asked, {len(gpus)} GPU(s) visible: one worker per GPU")
        gpus = gpus[:opts.workers] if opts.workers else gpus
        envs = [({"CUDA_VISIBLE_DEVICES": g}, {GPU: 1}) for g in gpus]
    else:
        envs = [({"CUDA_VISIBLE_DEVICES": ""}, None)] * (opts.workers or 2)
    return {f"worker-{i}": {"cls": Nanny, "options": {"nthreads": 1, "env": env, "resources": res,
                                                      "memory_limit": 0, "silence_logs": 40}}
            for i, (env, res) in enumerate(envs)}


def _config() -> dict:
    """Dask settings of the local scheduler: a death fails the task at once (the engine retries
    it, counting), and a worker takes one queued task at a time, so 'processing' means running."""
    return {"distributed.scheduler.allowed-failures": 0, "distributed.scheduler.worker-saturation": 1.0,
            "distributed.worker.daemon": False}   # so a task may start its own processes


class Engine:
    """A Dask client on a local or remote cluster; see the module docstring."""

    def __init__(self, client, cluster, opts: ClusterOptions):
        self.client, self.cluster, self.opts = client, cluster, opts

    @classmethod
    def open(cls, opts: ClusterOptions) -> "Engine":
        import dask
        from distributed import Client, Scheduler, SpecCluster
        if opts.scheduler:
            return cls(Client(opts.scheduler), None, opts)
        with dask.config.set(_config()):
            scheduler = {"cls": Scheduler, "options": {"dashboard_address": opts.dashboard}}
            cluster = SpecCluster(workers=worker_specs(opts), scheduler=scheduler, silence_logs=40)
            client = Client(cluster)
        client.wait_for_workers(len(cluster.worker_spec), timeout=120)
        return cls(client, cluster, opts)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    # -- what is there ----------------------------------------------------------------------
    def workers(self) -> dict[str, dict]:
        return self.client.scheduler_info(n_workers=-1)["workers"]

    def gpu_workers(self) -> int:
        return sum(bool((w.get("resources") or {}).get(GPU)) for w in self.workers().values())

    def describe(self) -> str:
        """One line: where the scheduler is, its workers and GPUs, the dashboard."""
        n, gpus = len(self.workers()), self.gpu_workers()
        where = self.opts.scheduler or "a local cluster"
        kind = f"{gpus} with a GPU each" if gpus else "CPU only"
        return f"Dask: {where}, {n} worker(s), {kind}; dashboard {self.dashboard()}"

    def dashboard(self) -> str:
        try:
            import bokeh  # noqa: F401  (distributed serves the dashboard only with bokeh)
        except ImportError:
            return f"{self.client.dashboard_link} (not served here: bokeh is not installed)"
        return self.client.dashboard_link

    def run_everywhere(self, fn: Callable, *args) -> dict[str, object]:
        """fn(*args) once in every worker process: worker address -> its result."""
        return self.client.run(fn, *args)

    # -- running tasks ----------------------------------------------------------------------
    def map(self, fn: Callable, items: Iterable[tuple[str, tuple]], gpu: bool | None = None,
            say: Callable[[str], None] = lambda line: print(line, flush=True), stop: Callable[[], bool] | None = None) -> Iterator[Done]:
        """fn(*args) for each (key, args), as Dask tasks; yields a Done per key as each finishes
        (or is given up).  gpu: ask a whole GPU per task (default: when the workers have GPUs).
        stop() true: start no more tasks (those running finish and are yielded)."""
        from distributed import as_completed
        gpu = self.gpu_workers() > 0 if gpu is None else gpu
        resources = {GPU: 1} if gpu else None
        args_of = dict(items)
        tries = {k: 0 for k in args_of}
        self._hung: set[str] = set()   # keys of the tasks whose worker the hang check killed

        def submit(key: str):
            tries[key] += 1
            return self.client.submit(_call, fn, key, self.opts.env, *args_of[key], key=f"{key} #{tries[key]}",
                                      resources=resources, pure=False, retries=0)
        todo = list(args_of)
        futures, pending, handed = {}, as_completed(), set()

        def fill() -> None:
            # only as many tasks in flight as there are worker threads: a task waiting in a
            # worker's queue would be lost with the worker (and counted a try) though it never ran
            if stop is not None and stop():
                todo.clear()
            free = max(1, self.slots(gpu)) - len(futures)
            for key in todo[:max(0, free)]:
                fut = submit(key)
                futures[fut.key] = key
                pending.add(fut)
            del todo[:max(0, free)]
        fill()
        while futures or todo:
            self._restart_hung(say)
            for fut in pending.next_batch(block=False) or self._wait(pending):
                key = futures.pop(fut.key)
                if key in handed:
                    continue
                if fut.status == "finished":
                    handed.add(key)
                    result, worker = fut.result()
                    yield Done(key, result, None, tries[key], worker)
                    continue
                why = (f"hung: still running after {self.opts.hang_s:g} s, its worker was killed"
                       if key in self._hung else _why(fut))
                self._hung.discard(key)
                fut.release()
                if tries[key] <= self.opts.retries:
                    say(f"[cluster] {key}: try {tries[key]} lost ({why}); trying again")
                    todo.insert(0, key)
                else:
                    handed.add(key)
                    yield Done(key, None, why, tries[key])
            fill()

    def slots(self, gpu: bool) -> int:
        """Tasks the workers can run at once: their threads (GPU tasks: their GPUs)."""
        ws = self.workers().values()
        return sum(int((w.get("resources") or {}).get(GPU, 0)) if gpu else w.get("nthreads", 1) for w in ws)

    def _wait(self, pending) -> list:
        """Up to POLL_S for the next finished future (so hung tasks are looked at meanwhile)."""
        deadline = time.monotonic() + POLL_S
        while time.monotonic() < deadline:
            if pending.has_ready():
                return pending.next_batch(block=False)
            time.sleep(0.05)
        return []

    def _restart_hung(self, say: Callable[[str], None]) -> None:
        if self.opts.hang_s is None:
            return
        running = self.client.run(_running, on_error="return")
        now = time.time()
        hung = {addr: key for addr, tasks in running.items() if isinstance(tasks, dict)
                for key, start in tasks.items() if now - start > self.opts.hang_s}
        for addr, key in hung.items():
            self._hung.add(key)
            say(f"[cluster] {key}: running for over {self.opts.hang_s:g} s; restarting its worker {addr}")
        if hung:
            # a graceful restart waits for the hung task's thread; a killed worker's nanny starts a new one
            self.client.run(_die, workers=list(hung), wait=False)


def _why(fut) -> str:
    try:
        exc = fut.exception()
    except Exception as cancelled:   # a future the scheduler forgot (its client reconnected)
        exc = cancelled
    name = type(exc).__name__
    if name == "KilledWorker":
        return "its worker died or was restarted"
    return f"{name}: {str(exc)[:300]}"


# -- inside a worker -------------------------------------------------------------------------

_RUNNING: dict[str, float] = {}   # in each worker process: task key -> its start (time.time())


def _running(dask_worker=None) -> dict[str, float]:
    return dict(_RUNNING)


async def _die(dask_worker=None) -> None:   # a coroutine: run() can start it without waiting
    os.kill(os.getpid(), signal.SIGKILL)


def _call(fn: Callable, key: str, env: dict, *args):
    """A task as a worker runs it: the run's environment set (children inherit it), its start
    known to the hang check; returns (fn's result, this worker's address)."""
    from distributed import get_worker
    os.environ.update(env)
    _RUNNING[key] = time.time()
    try:
        return fn(*args), get_worker().address
    finally:
        _RUNNING.pop(key, None)


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the child is killed when the thread that started it ends, so a worker that
    dies or is restarted leaves no orphan (an orphan would keep the GPU busy).  Linux only;
    elsewhere a no-op."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


# -- the command-line face, shared by every runner ---------------------------------------------

def add_cluster_args(parser) -> None:
    g = parser.add_argument_group("scale-out on Dask (one worker per GPU; CPU workers without one)")
    g.add_argument("--workers", type=int, help="run the tasks on a local Dask cluster of this many workers "
                   "(on a GPU host: at most one per GPU)")
    g.add_argument("--scheduler", help="run the tasks on an existing Dask scheduler (tcp://host:8786)")
    g.add_argument("--retries", type=int, default=2, help="new tries of a task whose worker died or hung")
    g.add_argument("--hang", type=float, help="seconds after which a running task counts as hung (its worker is "
                   "killed and the task tried again)")
    g.add_argument("--chroma", help="a shared Chroma server (host:port) every worker records its histories into")


class _NoEngine:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def open_engine(args, cpu_only: bool = False):
    """The engine the parsed --workers / --scheduler ask for (printing where its dashboard is),
    or a context giving None: run in this process as before."""
    if not (args.workers or args.scheduler):
        return _NoEngine()
    env = {"MTMC_CHROMA_HOST": args.chroma} if args.chroma else {}
    os.environ.update(env)   # this process indexes what it merges into the same server
    try:
        engine = Engine.open(ClusterOptions(args.workers, args.scheduler, args.retries, args.hang, env,
                                            cpu_only=cpu_only))
    except ValueError as exc:   # more GPU workers asked than GPUs: say so, no traceback
        raise SystemExit(f"--workers: {exc}") from exc
    print(engine.describe(), flush=True)
    return engine
