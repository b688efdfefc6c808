"""Whole modules on real inputs: a ModelNew against the original Model, timed and checked the
way KernelBench does it.  Runs ONLY in sandboxed children (worker jobs):

  "module_time"      {"path": NEW.py, "device": "cuda"}
        -> NEW's ModelNew against NEW's own Model: eager and torch.compile ms (mtmc optimize)
  "module_eval"      {"path": TASK.py, "new_path": NEW.py, "device": "cpu"|"cuda", "trials": 3, "time": bool}
        -> correctness on `trials` fresh input sets (torch.allclose at atol = rtol = 1e-2 and
           1e-4, max abs / rel error), launches of NEW's Triton kernels and their share of GPU
           time, ModelNew's ms (GPU only, and only when correct at 1e-2)
  "module_baseline"  {"path": TASK.py, "mode": "eager" | a torch.compile mode, "device": "cuda"}
        -> the original Model's ms (and compile seconds)
  "module_replay_time" {"path": NEW.py, "other": NEW_replay.py, "device": "cuda"}
        -> the two ModelNew's ms on one input set (the launch-overhead action, module.graph_replay)

KernelBench semantics: Model(*get_init_inputs()) left in training mode (no .eval()); ModelNew
built from the same init inputs under the same seed, with Model's state_dict loaded (strict);
models and inputs are created on the device (under `with torch.device(...)`, so several-GB
inputs never sit on the host); every forward runs under no_grad, each model's after re-seeding,
so dropout draws the same numbers for both.  Nothing is written to disk.
"""
from __future__ import annotations

import ast
import math
import os

TOLERANCES = {"1e-2": 1e-2, "1e-4": 1e-4}   # atol = rtol, as KernelBench's papers and its fp32 code
CHUNK = 1 << 26   # elements compared at once: the float64 temporaries of a huge output stay small


def load_task(path: str, role: str):
    from mtmc.tools.loader import load_file
    return load_file(path, f"mtmc_{role}_{os.getpid()}")


def build_models(task, new_module, device: str, seed: int):
    """(Model, ModelNew) on `device`, both built under `seed` from one get_init_inputs(), with
    Model's state_dict loaded into ModelNew; ModelNew is None when new_module is None."""
    import torch

    from mtmc.tools.guard.draw import seed_everything
    with torch.device(device):
        seed_everything(seed)
        init = list(task.get_init_inputs())
        model = task.Model(*init)
        new = None
        if new_module is not None:
            seed_everything(seed)  # tensors kept outside the state_dict come out the same too
            new = new_module.ModelNew(*init)
    model = model.to(device)
    if new is not None:
        new.load_state_dict(model.state_dict())
        new = new.to(device)
    return model, new


def make_inputs(task, device: str, seed: int) -> list:
    """get_inputs() under `seed`, drawn where they are used."""
    import torch
    from torch.utils._pytree import tree_map

    from mtmc.tools.guard.draw import seed_everything
    with torch.device(device):
        seed_everything(seed)
        inputs = list(task.get_inputs())
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, inputs)


def seeded_forward(model, inputs: list, seed: int) -> list:
    """The tensors model(*inputs) returns, the RNG reset first (dropout in training mode)."""
    import torch

    from mtmc.tools.guard.draw import seed_everything
    from mtmc.tools.guard.reference import outputs_of
    seed_everything(seed)
    with torch.no_grad():
        return outputs_of(model(*inputs))


# -- correctness ----------------------------------------------------------------------------

def _mismatch(problem: str) -> dict:
    return {"problem": problem, "close": {k: False for k in TOLERANCES}, "max_abs_err": math.inf,
            "max_rel_err": math.inf}


def compare_output(new, ref) -> dict:
    """One output against Model's: torch.allclose at each tolerance (equal values, infs
    included, are close; NaN never is), the max abs error and that error over the largest
    |ref| (the guard's relative error)."""
    import torch
    if not isinstance(new, torch.Tensor):
        return _mismatch(f"a {type(new).__name__}, not a tensor")
    if new.shape != ref.shape or new.dtype != ref.dtype:
        return _mismatch(f"{new.dtype} {tuple(new.shape)} where Model gives {ref.dtype} {tuple(ref.shape)}")
    a, b = new.detach().reshape(-1).to(ref.device), ref.detach().reshape(-1)
    far = {k: 0 for k in TOLERANCES}
    max_abs, peak = 0.0, 0.0
    for start in range(0, b.numel(), CHUNK):
        x, y = a[start:start + CHUNK].double(), b[start:start + CHUNK].double()
        same = x == y
        diff = torch.where(same, 0.0, (x - y).abs().nan_to_num(nan=math.inf))
        for k, tol in TOLERANCES.items():
            far[k] += int((diff > tol + tol * y.abs()).sum())
        max_abs = max(max_abs, float(diff.max()) if diff.numel() else 0.0)
        finite = y.abs()[torch.isfinite(y)]
        peak = max(peak, float(finite.max()) if finite.numel() else 0.0)
    rel = max_abs / peak if peak > 0 else (0.0 if max_abs == 0 else math.inf)
    return {"problem": None, "close": {k: n == 0 for k, n in far.items()}, "max_abs_err": max_abs, "max_rel_err": rel}


def compare_outputs(new: list, ref: list) -> dict:
    """Every output of one forward: close at a tolerance only when all are."""
    if len(new) != len(ref):
        return _mismatch(f"{len(new)} outputs where Model gives {len(ref)}")
    each = [compare_output(n, r) for n, r in zip(new, ref)]
    return {"problem": "; ".join(f"output {i}: {c['problem']}" for i, c in enumerate(each) if c["problem"]) or None,
            "close": {k: all(c["close"][k] for c in each) for k in TOLERANCES},
            "max_abs_err": max((c["max_abs_err"] for c in each), default=0.0),
            "max_rel_err": max((c["max_rel_err"] for c in each), default=0.0)}


# -- Triton coverage --------------------------------------------------------------------------

def _is_jit(decorator: ast.expr) -> bool:
    """@triton.jit, @jit, @triton.jit(...)."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name == "jit"


def triton_kernel_names(source: str) -> set[str]:
    """Names of the @triton.jit functions a file defines: how its kernels are called when
    launched and in the profiler."""
    return {node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list)}


def triton_coverage(new, inputs: list, ours: set[str], device: str) -> dict:
    """Our kernels' launches in one call of ModelNew and, on a GPU, their share of its kernel
    time (torch.profiler).  Installs a launch counter for good: call it after any timing."""
    from mtmc.tools.guard import probes
    counter = probes.LaunchCounter()
    counter.install()
    seeded_forward(new, inputs, 0)
    launched = {name: n for name, n in counter.names.items() if name in ours}
    out = {"kernels_defined": sorted(ours), "launches": launched, "ours": bool(launched),
           "gpu_share": None, "ours_us": None, "total_us": None}
    if device == "cuda":
        kernels = probes.profile_kernels(lambda: seeded_forward(new, inputs, 0))
        total = sum(k["us"] for k in kernels)
        mine = sum(k["us"] for k in kernels if k["name"] in ours)
        out.update(ours_us=mine, total_us=total, gpu_share=mine / total if total > 0 else None)
    return out


# -- the jobs -----------------------------------------------------------------------------------

def _synchronize(device: str) -> None:
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def evaluate_files(task_path: str, new_path: str, device: str, trials: int = 3, timed: bool = True) -> dict:
    """ModelNew of new_path against Model of task_path (see the module's docstring)."""
    from pathlib import Path

    from mtmc.tools.guard.draw import fresh_seed
    from mtmc.tools.timing import bench_ms
    task, new_module = load_task(task_path, "task"), load_task(new_path, "new")
    if not hasattr(new_module, "ModelNew"):
        raise ValueError(f"{os.path.basename(new_path)} defines no ModelNew")
    seeds = [fresh_seed() for _ in range(trials + 1)]  # the first builds the weights
    model, new = build_models(task, new_module, device, seeds[0])
    checks = []
    for seed in seeds[1:]:
        inputs = make_inputs(task, device, seed)
        ref = seeded_forward(model, inputs, seed)
        out = seeded_forward(new, inputs, seed)
        _synchronize(device)
        checks.append(compare_outputs(out, ref))
        del inputs, ref, out  # one input set on the device at a time
    correct = {k: all(c["close"][k] for c in checks) for k in TOLERANCES}
    result = {"device": device, "seeds": seeds, "trials": checks, "correct": correct,
              "max_abs_err": max(c["max_abs_err"] for c in checks), "max_rel_err": max(c["max_rel_err"] for c in checks),
              "new_ms": None, "timing": "not measured (no GPU)" if device != "cuda" else "not measured (incorrect at 1e-2)"}
    if not correct["1e-4"]:   # at 1e-2 too: Mamba2's values reach 1e14, and Model itself is off float64 there
        result["float64"] = float64_errors(task, model, new, device, seeds[1])
    inputs = make_inputs(task, device, seeds[1])
    if timed and device == "cuda" and correct["1e-2"]:
        import torch
        with torch.no_grad():
            result["new_ms"] = bench_ms(lambda: new(*inputs))
        result["timing"] = "median of triton.testing.do_bench, L2 flushed"
    result["triton"] = triton_coverage(new, inputs, triton_kernel_names(Path(new_path).read_text()), device)
    return result


def float64_errors(task, model, new, device: str, seed: int) -> dict:
    """Which of the two is off where ModelNew and Model differ beyond 1e-4 (or 1e-2): each one's
    relative error against Model run in float64 on the same inputs.  L3 49 (Mamba2: exp of
    cumsums, values to 1e14) failed 1e-2 against Model on the H100 while Model's own fp32 output
    is not within 1e-2 of its float64 one either.  cuDNN runs most fp32 convs in TF32
    by default (about 3e-4 of the largest value), our conv kernels keep fp32 accuracy (about
    1e-7): L2 15 on the H100 failed 1e-4 against Model's own fp32 output that way.  {"error": why}
    where float64 cannot be run (memory, an op without a float64 kernel)."""
    import torch

    from mtmc.tools.model_copy import deep_copy
    try:
        inputs = make_inputs(task, device, seed)
        ref, out = seeded_forward(model, inputs, seed), seeded_forward(new, inputs, seed)
        wide = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        del inputs
        truth = seeded_forward(deep_copy(model).double(), wide, seed)
        truth = [t.to(r.dtype) if isinstance(t, torch.Tensor) and isinstance(r, torch.Tensor) else t
                 for t, r in zip(truth, ref)]
        return {"model": compare_outputs(ref, truth)["max_rel_err"], "new": compare_outputs(out, truth)["max_rel_err"]}
    except (RuntimeError, TypeError) as e:   # torch.OutOfMemoryError is a RuntimeError
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()


def baseline_time(task_path: str, mode: str, device: str = "cuda") -> dict:
    """The original Model's ms in eager PyTorch (mode "eager") or under torch.compile(mode=mode);
    a compile failure is a result ("ms": None and why), not an error."""
    import torch

    from mtmc.tools.guard.draw import fresh_seed
    from mtmc.tools.timing import bench_ms, compiled_ms
    if device != "cuda":
        raise RuntimeError("baselines are timed on a CUDA GPU")
    task = load_task(task_path, "task")
    seed = fresh_seed()
    model, _ = build_models(task, None, device, seed)
    inputs = make_inputs(task, device, seed)
    with torch.no_grad():
        if mode != "eager":
            return compiled_ms(model, inputs, mode)
        model(*inputs)  # warm up (cuBLAS / cuDNN handles) outside the timed region
        return {"ms": bench_ms(lambda: model(*inputs)), "compile_s": None, "note": "eager PyTorch"}


def time_file(path: str) -> dict:
    """NEW.py's ModelNew against its own Model on one input set: eager, torch.compile (default
    mode) and ModelNew ms, and the speedups."""
    import torch

    from mtmc.tools.guard.draw import fresh_seed
    from mtmc.tools.timing import bench_ms, compiled_ms
    if not torch.cuda.is_available():
        raise RuntimeError("module timing needs a CUDA GPU")
    module = load_task(path, "new")
    seed = fresh_seed()
    model, new = build_models(module, module, "cuda", seed)
    inputs = make_inputs(module, "cuda", seed)
    result = {"measured": True, "device": torch.cuda.get_device_name(0),
              "label": "measured: median of triton.testing.do_bench, L2 flushed"}
    with torch.no_grad():
        new(*inputs)  # first call compiles the kernels, outside the timed region
        result["eager_ms"] = bench_ms(lambda: model(*inputs))
        result["ours_ms"] = bench_ms(lambda: new(*inputs))
        compiled = compiled_ms(model, inputs)
    result["compiled_ms"], result["compiled_note"] = compiled["ms"], compiled["note"]
    result["speedup_vs_eager"] = result["eager_ms"] / result["ours_ms"]
    result["speedup_vs_compiled"] = (result["compiled_ms"] / result["ours_ms"]) if result["compiled_ms"] else None
    return result


def replay_time_file(path: str, other: str) -> dict:
    """ModelNew of `path` (plain) and of `other` (its forward replayed as a CUDA graph) timed on
    the same inputs; whether the replaying one captured a graph at all."""
    import torch

    from mtmc.tools.guard.draw import fresh_seed
    from mtmc.tools.timing import bench_ms
    if not torch.cuda.is_available():
        raise RuntimeError("module timing needs a CUDA GPU")
    seed = fresh_seed()
    result = {"measured": True, "device": torch.cuda.get_device_name(0)}
    for key, file in (("plain_ms", path), ("replay_ms", other)):
        module = load_task(file, key.split("_")[0])
        _, new = build_models(module, module, "cuda", seed)
        inputs = make_inputs(module, "cuda", seed)
        with torch.no_grad():
            new(*inputs)   # compiles the kernels; the replaying one also captures its graph
            result[key] = bench_ms(lambda: new(*inputs))
        if key == "replay_ms":
            result["captured"] = any(v is not False for v in new.__dict__.get("_mtmc_graphs", {}).values())
        del new, inputs
        torch.cuda.empty_cache()
    return result


def replay_time_job(job: dict) -> dict:
    """Worker handler of "module_replay_time"."""
    from mtmc.tools.offline import block_network
    block_network()
    return replay_time_file(job["path"], job["other"])


def time_job(job: dict) -> dict:
    """Worker handler: {"kind": "module_time", "path", "device": "cuda"}."""
    from mtmc.tools.offline import block_network
    block_network()
    return time_file(job["path"])


def eval_job(job: dict) -> dict:
    """Worker handler of "module_eval"."""
    from mtmc.tools.offline import block_network
    block_network()
    return evaluate_files(job["path"], job["new_path"], job.get("device", "cpu"), int(job.get("trials", 3)),
                          bool(job.get("time", True)))


def baseline_job(job: dict) -> dict:
    """Worker handler of "module_baseline"."""
    from mtmc.tools.offline import block_network
    block_network()
    return baseline_time(job["path"], job["mode"], job.get("device", "cuda"))
