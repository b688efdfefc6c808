"""The trusted side of a module verification: worker job "reference_run", in its own sandboxed
child (the reference is uploaded code too, and the candidate never shares a process with it).

  {"kind": "reference_run", "path": REFERENCE.py, "dir": private directory, "device": "cpu"|"cuda",
   "time": bool, "max_elems": int | None (cut inputs along dim 0 to this size: for the interpreter)}
  -> {"variants", "notes", "ops" (aten compute ops of one eager forward), "float64" (whether
      the float64 ground truth could be computed), "eager_ms" (GPU only), "outputs"}

It builds Model(*get_init_inputs()) under a fresh seed, draws one set of inputs per variant
(guard.draw), runs Model eagerly on the device and in float64 (on the device too; on the CPU
when the device runs out of memory), and writes
  dir/inputs.pt     init inputs, the state_dict, the mode and every trial's inputs (what the
                    candidate gets)
  dir/reference.pt  eager and float64 outputs (what it must never see; the parent deletes it
                    before the candidate starts)
"""
from __future__ import annotations

import copy
import os
from pathlib import Path

from mtmc.tools.guard.draw import VARIANTS, draw_inputs, fresh_seed, seed_everything, shrink


def outputs_of(result) -> list:
    """The tensors a forward returned, in a fixed order (tuples, lists, dicts walked)."""
    from torch.utils._pytree import tree_flatten
    return tree_flatten(result)[0]


def to_device(tree, device, dtype=None):
    """Tensors of a (nested) input list moved to `device`; floating ones cast to `dtype`."""
    import torch
    from torch.utils._pytree import tree_map

    def move(x):
        if not isinstance(x, torch.Tensor):
            return x
        cast = dtype if dtype is not None and x.is_floating_point() else None
        return x.to(device=device, dtype=cast).clone()
    return tree_map(move, tree)


def _eager(model, inputs, device):
    import torch

    from mtmc.tools.guard.probes import OpCounter
    counter = OpCounter()
    with torch.no_grad(), counter:
        outs = outputs_of(model(*to_device(inputs, device)))
    bad = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
    if bad or not outs:
        raise TypeError(f"the reference Model must return tensors; it returned {bad or 'nothing'}")
    return [o.detach().cpu().clone() for o in outs], counter.ops


def _float64(model64, inputs, device):
    """Model's outputs in float64, on the GPU where there is one (a float64 forward of a
    GiB-sized module takes minutes on the CPU), on the CPU when the GPU runs out of memory."""
    import torch
    if model64 is None:
        return None
    for where in dict.fromkeys((device, "cpu")):
        try:
            with torch.no_grad():
                model64.to(where)
                outs = outputs_of(model64(*to_device(inputs, where, torch.float64)))
                return [o.detach().to("cpu", torch.float64) for o in outs]
        except torch.cuda.OutOfMemoryError:
            continue  # on the CPU, once `finally` has moved the model back
        except Exception:  # an op without a float64 kernel: ground truth falls back to eager
            return None
        finally:
            if where != "cpu":  # keep the GPU free for the eager model and later variants
                model64.to("cpu")
                torch.cuda.empty_cache()
    return None


def _mode(model, get_inputs, device) -> str:
    """"train", or "eval" when Model is random in training mode (dropout): two runs of a copy on
    the same inputs differ.  Random even in eval mode, no output can be checked."""
    import torch
    probe = copy.deepcopy(model)  # probing must not move the running statistics handed over
    inputs, _ = draw_inputs(get_inputs, VARIANTS[0])
    for mode in ("train", "eval"):
        probe.train(mode == "train")
        a, b = _eager(probe, inputs, device)[0], _eager(probe, inputs, device)[0]
        if all(torch.allclose(x, y, rtol=1e-4, atol=1e-6, equal_nan=True) for x, y in zip(a, b)):
            return mode
    raise ValueError("Model gives different outputs on the same inputs even in eval mode: nothing can be checked")


def reference_job(job: dict) -> dict:
    import torch

    from mtmc.kernels.loader import load_file
    from mtmc.tools.offline import block_network
    block_network()
    device, out_dir = job.get("device", "cpu"), Path(job["dir"])
    module = load_file(job["path"], f"mtmc_reference_{os.getpid()}")
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
    if missing:
        raise ValueError(f"the reference defines no {', '.join(missing)}")
    seed_everything(fresh_seed())
    init = list(module.get_init_inputs())
    model = module.Model(*init)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    try:
        model64 = copy.deepcopy(model).to("cpu", torch.float64)
    except Exception:
        model64 = None
    model.to(device)
    mode = _mode(model, module.get_inputs, device)
    model.train(mode == "train")
    if model64 is not None:
        model64.train(mode == "train")
    trials, notes, ops = [], [], None
    if mode == "eval":
        notes.append("Model is random in training mode (dropout?): both are compared in eval mode")
    max_elems = job.get("max_elems")

    def draw(variant):
        inputs, _ = draw_inputs(module.get_inputs, variant)
        return shrink(inputs, max_elems) if max_elems else (inputs, False)
    for variant in VARIANTS:
        inputs, cut = draw(variant)
        try:
            eager, counted = _eager(model, inputs, device)
        except Exception as e:
            if cut:
                raise ValueError("the inputs are too large for Triton's interpreter and Model rejects a smaller "
                                 f"batch ({type(e).__name__}: {str(e)[:200]})") from e
            if variant == VARIANTS[0]:
                raise
            notes.append(f"{variant}: Model raised {type(e).__name__} on these inputs; drew {VARIANTS[0]} instead")
            variant = VARIANTS[0]
            inputs, cut = draw(variant)
            eager, counted = _eager(model, inputs, device)
        if cut and not trials:
            notes.append(f"inputs cut along dim 0 to {[list(x.shape) for x in inputs if hasattr(x, 'shape')]} "
                         "for Triton's interpreter")
        ops = ops if ops is not None else counted
        trials.append({"variant": variant, "inputs": inputs, "eager": eager, "ref64": _float64(model64, inputs, device)})
    has64 = all(t["ref64"] is not None and len(t["ref64"]) == len(t["eager"]) for t in trials)
    if not has64:
        notes.append("Model does not run in float64: outputs are judged against eager PyTorch")
    torch.save({"init": init, "state": state, "mode": mode, "inputs": [t["inputs"] for t in trials]},
               out_dir / "inputs.pt")
    torch.save({"eager": [t["eager"] for t in trials],
                "ref64": [t["ref64"] if has64 else None for t in trials]}, out_dir / "reference.pt")
    result = {"variants": [t["variant"] for t in trials], "notes": notes, "mode": mode, "ops": dict(ops), "float64": has64,
              "eager_ms": None}
    if job.get("time") and device == "cuda":
        from mtmc.tools.timing import bench_ms
        x = to_device(trials[0]["inputs"], device)
        with torch.no_grad():
            result["eager_ms"] = bench_ms(lambda: model(*x))
    return result
