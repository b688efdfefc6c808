"""A spec as the plain data the tools check, time and compile a candidate against (the tools never
import the catalog), and the spec-level faces of those tools.

  task_of(spec) -> {"dims", "dtype", "describe", "inputs": [{"name", "shape", "dtype", "init"}],
                 "output": {...}, "reference": source of reference(*inputs) (and error_scale or
                 compare), "work": {"flops", "bytes"} at the spec's dims}
  task_job(job) -> a worker job with "spec" replaced by its task (plus "time_task" at the
                 timing dims); run_job / Session: tools.worker's, taking such jobs
  check, reference_namespace, time_candidate, compile_resources: the tools' functions
                 of the same names, called with a spec
"""
from __future__ import annotations

from mtmc.kernels.catalog import describe, family_of
from mtmc.kernels.family import TensorArg
from mtmc.kernels.spec import KernelSpec
from mtmc.tools import correctness, timing, worker


def _arg(a: TensorArg, spec: KernelSpec) -> dict:
    out = {"name": a.name, "shape": list(a.shape), "dtype": a.dtype or spec.dtype, "init": a.init}
    if a.groups != 1:   # a grouped conv's weight: "C_in/G" is C_in over the groups
        out["groups"] = a.groups
    return out


def task_of(spec: KernelSpec) -> dict:
    fam = family_of(spec)
    flops, nbytes = fam.work(spec)
    return {"dims": dict(spec.dims), "dtype": spec.dtype, "describe": describe(spec),
            "inputs": [_arg(a, spec) for a in fam.inputs(spec)], "output": _arg(fam.output(spec), spec),
            "reference": fam.reference_source(spec), "work": {"flops": flops, "bytes": nbytes}}


def task_job(job: dict) -> dict:
    """A worker job with its "spec" turned into tasks: the timing's at its dims ("time_dims" of a
    verify job, "dims" of a time job, else the spec's)."""
    if "spec" not in job:
        return job
    spec = KernelSpec.from_dict(job["spec"])
    out = {k: v for k, v in job.items() if k not in ("spec", "time_dims")}
    out["task"] = task_of(spec)
    time_dims = job.get("time_dims") if job.get("kind") == "verify" else job.get("dims") if job.get("kind") == "time" else None
    if time_dims and dict(time_dims) != spec.dims:
        out["time_task"] = task_of(spec.with_dims(**time_dims))
    return out


def run_job(job: dict, timeout_s: float, **options) -> dict:
    """tools.worker.run_job for a job that may name a spec."""
    return worker.run_job(task_job(job), timeout_s, **options)


class Session(worker.Session):
    """tools.worker.Session whose jobs may name a spec."""

    def call(self, job: dict, timeout_s: float) -> dict:
        return super().call(task_job(job), timeout_s)


def check(spec: KernelSpec, source: str, dims: dict | None = None, device: str = "cpu", trials: int = 2):
    return correctness.check(task_of(spec), source, dims, device, trials)


def reference_namespace(spec: KernelSpec) -> dict:
    return correctness.reference_namespace(task_of(spec))


def time_candidate(spec: KernelSpec, source: str, dims: dict | None = None, baselines: bool = True,
                   compile_baseline: bool = True) -> dict:
    return timing.time_candidate(task_of(spec.with_dims(**(dims or spec.dims))), source, baselines, compile_baseline)


def compile_resources(source: str, spec: KernelSpec, dims: dict | None, profile):
    return worker.compile_resources(source, task_of(spec), dims, profile)
