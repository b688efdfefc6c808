"""The candidate's side of a module verification: a session (tools.sandbox.Session) of its own
that never holds the reference's outputs.

Jobs, in the verifier's order (state stays in this process between them):
  candidate_open  {"path", "device", "payload" (init inputs, state_dict, mode, Model's build seed: exchange), "dir"}
                  -> observations: poison memory, take baselines (threads, timing functions, the
                  helpers used here), install the launch and stream counters, import CANDIDATE,
                  build ModelNew(*init) under Model's seed and load the reference's state_dict (strict)
  candidate_trial {"index", "payload" (the variant's inputs), "dir", "poison_bytes"}
                  -> {"obs", "payload"}: the first trial copies the inputs into buffers of its
                  own; every later trial refills THE SAME buffers in place with the new values
                  (a result cached per buffer would come back stale); then poison the CUDA cache,
                  run forward under the op counter, record what changed, and share the outputs
                  and the buffers as they are after the call
  candidate_time  {"dir"} (GPU) -> one profiled call, the median time, and the timed output shared
Everything observed is returned; nothing is judged here.
"""
from __future__ import annotations

import contextlib
import os
import traceback

from mtmc.tools.guard import probes
from mtmc.tools.guard.draw import seed_everything
from mtmc.tools.guard.exchange import receive, share
from mtmc.tools.guard.reference import outputs_of, to_device

_RUN: dict = {}   # this session's candidate


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
        if device == "cuda" and torch.cuda.graph.default_capture_stream is None:
            # the one stream every CUDA-graph capture uses, made before the watch starts: a
            # ModelNew replaying its forward (module.graph_replay) creates none of its own
            torch.cuda.graph.default_capture_stream = torch.cuda.Stream()
        self.streams = probes.StreamWatch()
        self.streams.install()
        self.timing = probes.Snapshot(probes.TIMING_FUNCTIONS)
        self.hooks = probes.Snapshot((*probes.VERIFIER_HOOKS, f"{__name__}.share", f"{__name__}.receive"))
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


def _plain(x):
    """An output as the judge may see it: a plain tensor (where it is), else None."""
    import torch
    return x.detach() if type(x) is torch.Tensor else None


def _trial(new, x, device: str, watch: _Watch) -> tuple[dict, list]:
    import torch
    from torch.utils._pytree import tree_flatten
    before = watch.launches.names.copy()
    ops = probes.OpCounter(watch.launches)
    with torch.no_grad(), ops:
        outs = outputs_of(new(*x))
    if device == "cuda":
        torch.cuda.synchronize()
    flat_in = tree_flatten(x)[0]
    seen = {"launches": dict(watch.launches.names - before), "ops": dict(ops.ops),
            "aliases": probes.aliases(outs, flat_in), "format": probes.format_problems(outs, device)}
    return seen, [_plain(o) for o in outs]


def _time_and_profile(new, x, watch: _Watch, obs: dict) -> list:
    """GPU only: one profiled call (which kernels ran, on which streams), then the median time;
    returns the output of the last timed call, judged like any other."""
    import torch

    from mtmc.tools.timing import bench_ms
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
    return [_plain(o) for o in last]


def _refill(buffers, given):
    """The given values copied into the trial's buffers in place (same tensor objects); a new
    copy where a shape differs."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten
    old, spec = tree_flatten(buffers)
    new, new_spec = tree_flatten(given)
    if spec != new_spec:
        return to_device(given, _RUN["device"])
    out = []
    for b, g in zip(old, new):
        if isinstance(b, torch.Tensor) and isinstance(g, torch.Tensor) and b.shape == g.shape and b.dtype == g.dtype:
            b.copy_(g)
            out.append(b)
        else:
            out.append(g.clone() if isinstance(g, torch.Tensor) else g)
    return tree_unflatten(out, spec)


def open_job(job: dict) -> dict:
    import torch

    from mtmc.tools.loader import load_file
    from mtmc.tools.offline import block_network
    block_network()
    device = job.get("device", "cpu")
    obs = _new_observations()
    obs["poison"] = probes.poison_host_allocations() if device == "cpu" else "CUDA cache poisoned with NaN before every call"
    given = receive(job["payload"])
    watch = _Watch(obs, device)
    _RUN.clear()
    _RUN.update(obs=obs, watch=watch, device=device, buffers=None, shared=None)
    try:
        with _stage(obs, "import"):
            module = load_file(job["path"], f"mtmc_candidate_{os.getpid()}")
        watch.record("after import")
        with _stage(obs, "construct"):
            if not hasattr(module, "ModelNew"):
                raise AttributeError("the candidate defines no ModelNew")
            if given.get("seed") is not None:   # Model's construction seed (reference.open_job)
                seed_everything(given["seed"])
            new = module.ModelNew(*given["init"])
            new.load_state_dict(given["state"], strict=True)
            new.to(device).train(given.get("mode", "train") == "train")
        obs["loaded"] = True
        _RUN["new"] = new
    except _Stop:
        pass
    del given
    if device == "cuda":
        torch.cuda.synchronize()
    return obs


def trial_job(job: dict) -> dict:
    obs, watch, device = _RUN["obs"], _RUN["watch"], _RUN["device"]
    _RUN["shared"] = None    # the last trial's outputs: the judge has answered
    i = job["index"]
    given = receive(job["payload"])
    _RUN["buffers"] = to_device(given, device) if _RUN["buffers"] is None else _refill(_RUN["buffers"], given)
    del given
    if device == "cuda":
        probes.poison_cuda_cache(int(job.get("poison_bytes") or 0))
    try:
        with _stage(obs, f"forward (trial {i + 1})"):
            seen, outs = _trial(_RUN["new"], _RUN["buffers"], device, watch)
    except _Stop:
        return {"obs": obs, "payload": None}
    watch.record(f"after trial {i + 1}")
    obs["trials"].append(seen)
    _RUN["shared"] = {"outputs": outs, "inputs_after": _RUN["buffers"],
                      # the state the forward leaves (a BatchNorm's running statistics), judged like Model's
                      "state_after": {k: v.detach() for k, v in _RUN["new"].named_buffers()} if i == 0 else None}
    return {"obs": obs, "payload": share(_RUN["shared"], job["dir"], f"outputs{i}")}


def time_job(job: dict) -> dict:
    obs = _RUN["obs"]
    _RUN["shared"] = None
    try:
        with _stage(obs, "timing"):
            timed = _time_and_profile(_RUN["new"], _RUN["buffers"], _RUN["watch"], obs)
    except _Stop:
        return {"obs": obs, "payload": None}
    _RUN["shared"] = {"outputs": timed}
    return {"obs": obs, "payload": share(_RUN["shared"], job["dir"], "timed")}
