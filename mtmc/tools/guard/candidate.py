"""The candidate's side of a module verification: worker job "candidate_run", in its own
sandboxed child that never holds the reference's outputs.

  {"kind": "candidate_run", "path": CANDIDATE.py, "dir": exchange directory holding inputs.pt,
   "device": "cpu"|"cuda", "time": bool}
  -> observations (below); dir/outputs.pt gets every trial's outputs and inputs-after-the-call

Order: poison memory, warm up and take baselines (threads, timing functions, the helpers used
here), install the launch and stream counters, import CANDIDATE, build ModelNew(*init) and load
the reference's state_dict (strict), then per trial: poison the CUDA cache, run forward on fresh
copies of the inputs under the op counter, and record what changed.  On a GPU it then profiles
one call and times it.  Everything observed is returned; nothing is judged here.
"""
from __future__ import annotations

import contextlib
import os
import traceback
from pathlib import Path

from mtmc.tools.guard import probes
from mtmc.tools.guard.reference import outputs_of, to_device


class _Stop(Exception):
    """The candidate raised; what was observed so far stands."""


def _new_observations() -> dict:
    return {"error": None, "loaded": False, "tampered": [], "threads": {"python": [], "native": 0},
            "streams": {"created": 0, "current_changed": False, "used": []}, "trials": [],
            "profile": None, "ours_ms": None, "poison": ""}


@contextlib.contextmanager
def _stage(obs: dict, name: str):
    try:
        yield
    except (Exception, SystemExit) as e:  # the candidate's failure is an observation
        obs["error"] = {"stage": name, "type": type(e).__name__, "message": str(e)[-2000:],
                        "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]}
        raise _Stop from e


class _Watch:
    """The baselines, and one call to record what changed since them."""

    def __init__(self, obs: dict, device: str):
        import torch
        if device == "cpu":
            torch.set_num_threads(1)  # no lazily started worker pool to mistake for the candidate's
        self.obs = obs
        import triton.testing  # noqa: F401  (its do_bench must exist to be snapshotted)
        (torch.ones(64, 64, device=device) @ torch.ones(64, 64, device=device)).sum().item()
        self.launches = probes.LaunchCounter()
        self.launches.install()
        self.streams = probes.StreamWatch()
        self.streams.install()
        self.timing = probes.Snapshot(probes.TIMING_FUNCTIONS)
        self.hooks = probes.Snapshot(probes.VERIFIER_HOOKS)
        self.threads = probes.ThreadWatch()
        self.strict_native = device == "cpu"  # CUDA starts driver threads of its own

    def record(self, when: str, threads: bool = True) -> None:
        obs = self.obs
        for kind, snap in (("timing", self.timing), ("hooks", self.hooks)):
            for path in snap.changed():
                if not any(t["path"] == path for t in obs["tampered"]):
                    obs["tampered"].append({"kind": kind, "path": path, "when": when})
        if threads:
            names = self.threads.new_python()
            obs["threads"]["python"] = sorted(set(obs["threads"]["python"]) | set(names))
            if self.strict_native:
                obs["threads"]["native"] = max(obs["threads"]["native"], self.threads.new_native())
        obs["streams"]["created"] = self.streams.created
        obs["streams"]["current_changed"] |= self.streams.current_changed()


def _plain_cpu(x):
    import torch
    return x.detach().to("cpu").clone() if type(x) is torch.Tensor else None


def _trial(new, inputs, device: str, watch: _Watch, nbytes: int) -> tuple[dict, list, list]:
    import torch
    from torch.utils._pytree import tree_flatten, tree_map
    x = to_device(inputs, device)
    if device == "cuda":
        probes.poison_cuda_cache(4 * nbytes)
    before = watch.launches.names.copy()
    ops = probes.OpCounter(watch.launches)
    with torch.no_grad(), ops:
        outs = outputs_of(new(*x))
    if device == "cuda":
        torch.cuda.synchronize()
    flat_in = tree_flatten(x)[0]
    seen = {"launches": dict(watch.launches.names - before), "ops": dict(ops.ops),
            "aliases": probes.aliases(outs, flat_in), "format": probes.format_problems(outs, device)}
    return seen, [_plain_cpu(o) for o in outs], tree_map(lambda t: _plain_cpu(t) if isinstance(t, torch.Tensor) else t, x)


def _time_and_profile(new, inputs, device: str, watch: _Watch, obs: dict) -> list:
    """GPU only: one profiled call (which kernels ran, on which streams), then the median time;
    returns the output of the last timed call, checked by the parent like any other."""
    import torch

    from mtmc.tools.timing import bench_ms
    x = to_device(inputs, device)
    last: list = []

    def call():
        last[:] = outputs_of(new(*x))
    with torch.no_grad():
        call()  # compiles the kernels outside the profile and the timed region
        torch.cuda.synchronize()
        kernels = probes.profile_kernels(call)
        obs["ours_ms"] = bench_ms(call)
        torch.cuda.synchronize()
    launched = set(watch.launches.names)
    obs["gpu"] = torch.cuda.get_device_name(0)
    obs["profile"] = {"triton": [k for k in kernels if k["name"] in launched],
                      "other": [k for k in kernels if k["name"] not in launched]}
    obs["streams"]["used"] = sorted({str(k["stream"]) for k in kernels if k["stream"] is not None})
    watch.record("after timing", threads=False)  # the profiler starts threads of its own
    return [_plain_cpu(o) for o in last]


def run_candidate(path: str, exchange: Path, device: str, timed: bool) -> dict:
    import torch

    from mtmc.kernels.loader import load_file
    obs = _new_observations()
    obs["poison"] = probes.poison_host_allocations() if device == "cpu" else "CUDA cache poisoned with NaN before every call"
    given = torch.load(exchange / "inputs.pt", weights_only=True)
    nbytes = sum(t.numel() * t.element_size() for trial in given["inputs"] for t in trial if isinstance(t, torch.Tensor))
    watch = _Watch(obs, device)
    saved = {"outputs": [], "inputs_after": [], "timed": None}
    try:
        with _stage(obs, "import"):
            module = load_file(path, f"mtmc_candidate_{os.getpid()}")
        watch.record("after import")
        with _stage(obs, "construct"):
            if not hasattr(module, "ModelNew"):
                raise AttributeError("the candidate defines no ModelNew")
            new = module.ModelNew(*given["init"])
            new.load_state_dict(given["state"], strict=True)
            new.to(device).train(given.get("mode", "train") == "train")
        obs["loaded"] = True
        for i, inputs in enumerate(given["inputs"]):
            with _stage(obs, f"forward (trial {i + 1})"):
                seen, outs, after = _trial(new, inputs, device, watch, nbytes)
            watch.record(f"after trial {i + 1}")
            obs["trials"].append(seen)
            saved["outputs"].append(outs)
            saved["inputs_after"].append(after)
        if timed and device == "cuda":
            with _stage(obs, "timing"):
                saved["timed"] = _time_and_profile(new, given["inputs"][0], device, watch, obs)
    except _Stop:
        pass
    torch.save(saved, exchange / "outputs.pt")
    return obs


def candidate_job(job: dict) -> dict:
    from mtmc.tools.offline import block_network
    block_network()
    return run_candidate(job["path"], Path(job["dir"]), job.get("device", "cpu"), bool(job.get("time")))
