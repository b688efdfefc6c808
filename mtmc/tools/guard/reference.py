"""The trusted side of a module verification: a session (tools.sandbox.Session) that runs the
reference Model and judges the candidate's outputs, so the reference's outputs never leave it.

Jobs, in the order the verifier sends them (the state lives in this process between jobs):
  reference_open    {"path", "device", "time", "max_elems", "tf32"} -> {"variants", "notes", "mode"}
                    builds Model(*get_init_inputs()) under a fresh seed, on the device
  reference_state   {"dir"} -> {"payload"}: init inputs and the state_dict, shared (exchange)
  reference_variant {"index", "dir"} -> inputs drawn fresh for variants[index] (guard.draw) on the
                    device, Model's eager outputs and float64 truth kept here; the inputs shared;
                    plus what the checks need that depends on the reference alone (sizes, which
                    fake outputs the tolerance cannot tell apart, eager's time once)
  reference_judge   {"payload", "timed"} -> the candidate's outputs (and its inputs after the call)
                    compared with the truth here, on the device: numbers only go back

Float64 truth runs on the device; when it does not fit, in chunks along the batch (where Model
treats samples independently), else on the CPU, else eager outputs stand in (with a note).
Runs ONLY in a sandboxed child: it imports the reference file.
"""
from __future__ import annotations

import os

from mtmc.tools.guard import numeric
from mtmc.tools.guard.draw import SIGNED, VARIANTS, draw_inputs, fresh_seed, seed_everything, shrink
from mtmc.tools.guard.exchange import ipc_exports, receive, share, staged_cap
from mtmc.tools.model_copy import deep_copy

_RUN: dict = {}   # this session's reference run
HOST = "cpu"      # where float64 truth goes when the device cannot hold it


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


def flat_tensors(tree) -> list:
    import torch
    from torch.utils._pytree import tree_flatten
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _eager(model, inputs):
    """Model's outputs on a copy of the inputs (a Model may change its inputs in place), and the
    aten compute ops it ran."""
    import torch

    from mtmc.tools.guard.probes import OpCounter
    counter = OpCounter()
    x = to_device(inputs, flat_tensors(inputs)[0].device if flat_tensors(inputs) else "cpu")
    with torch.no_grad(), counter:
        outs = [o.detach() for o in outputs_of(model(*x))]
    del x
    bad = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
    if bad or not outs:
        raise TypeError(f"the reference Model must return tensors; it returned {bad or 'nothing'}")
    return outs, counter.ops


# -- float64 truth ----------------------------------------------------------------------------

def _forward64(model64, inputs, where) -> list:
    import torch
    with torch.no_grad():
        model64.to(where)
        return [o.detach().to(torch.float64) for o in outputs_of(model64(*to_device(inputs, where, torch.float64)))]


def _batch(inputs) -> int | None:
    """The leading size shared by every tensor input, when there is one to split along."""
    sizes = {x.shape[0] for x in flat_tensors(inputs) if x.dim() > 0}
    return sizes.pop() if len(sizes) == 1 else None


def _chunked64(model, model64, inputs, eager, device) -> list | None:
    """Float64 outputs computed a slice of the batch at a time, or None when Model does not treat
    samples independently (its eager outputs on two halves differ from the whole's)."""
    import torch
    n = _batch(inputs)
    if not n or n < 2:
        return None
    half = n // 2
    parts = [_eager(model, [x[a:b] if isinstance(x, torch.Tensor) and x.dim() else x for x in inputs])[0]
             for a, b in ((0, half), (half, n))]
    for j, e in enumerate(eager):
        joined = torch.cat([p[j] for p in parts]) if e.dim() and e.shape[0] == n else None
        if joined is None or not torch.allclose(joined, e, rtol=1e-4, atol=1e-5, equal_nan=True):
            return None
    for pieces in (2, 4, 8, 16, 64, 256):
        step = -(-n // pieces)
        try:
            outs = [_forward64(model64, [x[a:a + step] if isinstance(x, torch.Tensor) and x.dim() else x
                                         for x in inputs], device) for a in range(0, n, step)]
            return [torch.cat([o[j] for o in outs]) for j in range(len(eager))]
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
    return None


def _float64(model, model64, inputs, eager, device) -> tuple[list | None, str]:
    """Model's outputs in float64 (on the device; in chunks of the batch when they do not fit;
    on the CPU as a last resort) and how they were computed."""
    import torch
    if model64 is None:
        return None, "Model cannot be copied to float64"
    try:
        return _forward64(model64, inputs, device), "on the device"
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
    except Exception as e:  # an op without a float64 kernel: ground truth falls back to eager
        return None, f"Model does not run in float64 ({type(e).__name__})"
    chunked = _chunked64(model, model64, inputs, eager, device)
    if chunked is not None:
        return chunked, "on the device, in chunks of the batch"
    try:
        outs = _forward64(model64, inputs, HOST)
        model64.to(device)
        return [o.to(device) for o in outs], "on the CPU (it does not fit the device)"
    except Exception as e:
        model64.to(device)
        return None, f"float64 does not fit the device or the host ({type(e).__name__})"


# -- jobs -------------------------------------------------------------------------------------

def _mode(model) -> tuple[str, list, bool]:
    """("train", or "eval" when Model is random in training mode (dropout): two runs of a copy on
    the same inputs differ; notes on the inputs; whether a floating input is drawn non-negative).
    Random even in eval mode, no output can be checked; a Model that rejects the interpreter's
    cut batch cannot be checked here either."""
    import torch
    inputs, cut = _draw(VARIANTS[0])
    # cut for the interpreter on the CPU; on a GPU because CUDA IPC is refused and tensors cross as files
    why = "Triton's interpreter" if _RUN["device"] == "cpu" else "the file exchange (no CUDA IPC here)"
    notes = [f"inputs cut along dim 0 to {[list(x.shape) for x in flat_tensors(inputs)]} for {why}"] if cut else []
    for mode in ("train", "eval"):
        # two fresh copies from the state handed over: probing moves no running statistics, and a
        # forward that keeps state (an RNN's self.hidden) is not taken for a random one
        copies = [deep_copy(model).train(mode == "train") for _ in range(2)]
        try:
            a, b = (_eager(c, inputs)[0] for c in copies)
        except Exception as e:
            if cut and _uncut_fits():
                # Model's parameters are sized by the batch (KernelBench L3 Mamba2's A, B, C): the
                # check runs on the whole batch, staged through files of at most STAGED_FULL_BYTES
                _RUN["max_elems"] = None
                del copies, inputs
                return _mode(model)
            if cut:
                raise ValueError(f"the inputs are too large for {why} and Model rejects a smaller "
                                 f"batch ({type(e).__name__}: {str(e)[:200]})") from e
            raise
        if all(torch.allclose(x, y, rtol=1e-4, atol=1e-6, equal_nan=True) for x, y in zip(a, b)):
            return mode, notes, _nonneg(inputs)
    raise ValueError("Model gives different outputs on the same inputs even in eval mode: nothing can be checked")


# Inputs staged through files uncut when Model rejects a cut batch, up to this many bytes in all
STAGED_FULL_BYTES = 4 << 30


def _uncut_fits() -> bool:
    """Whether the whole batch may cross as files (on a GPU without CUDA IPC): its inputs' bytes."""
    if _RUN["device"] != "cuda":
        return False
    inputs, _ = draw_inputs(_RUN["module"].get_inputs, VARIANTS[0], _RUN["device"])
    size = sum(x.numel() * x.element_size() for x in flat_tensors(inputs))
    del inputs
    return size <= STAGED_FULL_BYTES


def _nonneg(inputs: list) -> bool:
    return any(x.is_floating_point() and x.numel() > 1 and bool(x.min() >= 0) for x in flat_tensors(inputs))


def _finite(outs: list) -> bool:
    import torch
    return all(bool(torch.isfinite(o).all()) for o in outs if o.is_floating_point())


class _Clock:
    """Seconds between named points of a job, in order."""

    def __init__(self):
        import time
        self._now, self._last, self.laps = time.monotonic, time.monotonic(), {}

    def lap(self, name: str) -> None:
        now = self._now()
        self.laps[name] = round(now - self._last, 2)
        self._last = now


def _not_dumpable() -> None:
    """A candidate running under the same uid (on a GPU the two sessions share a PID namespace
    for CUDA IPC) must not read this process's memory through /proc/PID/mem."""
    import ctypes
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def open_job(job: dict) -> dict:
    import torch

    from mtmc.tools.loader import load_file
    from mtmc.tools.offline import block_network
    block_network()
    _not_dumpable()
    _RUN.clear()
    device = job.get("device", "cpu")
    clock = _Clock()   # where the opening's seconds go (the verdict's phases show them)
    module = load_file(job["path"], f"mtmc_reference_{os.getpid()}")
    clock.lap("import")
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
    if missing:
        raise ValueError(f"the reference defines no {', '.join(missing)}")
    # the candidate builds ModelNew under the same seed, as KernelBench's harness does: tensors a
    # constructor draws outside the state_dict (an LSTM's h0 = torch.randn(...)) come out the same
    build_seed = fresh_seed()
    seed_everything(build_seed)
    init = list(module.get_init_inputs())
    with torch.device(device):   # parameters made where they are used
        model = module.Model(*init)
    model.to(device)
    clock.lap("build")
    try:
        model64 = deep_copy(model).to(torch.float64)
    except Exception:
        model64 = None
    clock.lap("float64 copy")
    max_elems = staged_cap(device, job.get("max_elems"), ipc_exports)
    clock.lap("ipc probe")
    _RUN.update(module=module, device=device, init=init, model=model, model64=model64, constants={}, build_seed=build_seed,
                max_elems=max_elems, time=bool(job.get("time")), eager_ms=None, trial=None, tf32=bool(job.get("tf32")))
    mode, notes, nonneg = _mode(model)
    clock.lap("mode probe")
    variants = list(VARIANTS) + ([SIGNED] if nonneg else [])   # draw.py says why
    if _RUN["max_elems"] != job.get("max_elems"):
        notes.append(f"CUDA IPC is refused here, so tensors cross as files: inputs are cut along the batch to "
                     f"{max_elems} elements each for this check")
    elif max_elems != job.get("max_elems"):
        notes.append("CUDA IPC is refused here, so tensors cross as files: the whole batch crosses (Model rejects "
                     "a cut one)")
    for m in (model, model64):
        if m is not None:
            m.train(mode == "train")
    if mode == "eval":
        notes.append("Model is random in training mode (dropout?): both are compared in eval mode")
    _RUN.update(mode=mode, notes=notes, variants=variants)
    return {"variants": variants, "notes": notes, "mode": mode, "seconds": clock.laps}


def state_job(job: dict) -> dict:
    state = {k: v.detach() for k, v in _RUN["model"].state_dict().items()}
    return {"payload": share({"init": _RUN["init"], "state": state, "mode": _RUN["mode"],
                                  "seed": _RUN["build_seed"]}, job["dir"], "state")}


def _draw(variant: str):
    inputs, _ = draw_inputs(_RUN["module"].get_inputs, variant, _RUN["device"])
    return shrink(inputs, _RUN["max_elems"]) if _RUN["max_elems"] else (inputs, False)


def _loose(truth: list, eager: list, inputs: list) -> list[list[str]]:
    """Per output: the fake outputs (zeros, a constant, a copy of an input) this variant's
    tolerance would accept.  A single-value output's constant is the first variant's value
    (numeric.fakes says why), kept in _RUN."""
    fixed = _RUN.setdefault("constants", {})
    for j, r in enumerate(truth):
        if r.numel() == 1 and j not in fixed:
            fixed[j] = numeric.mean(r)
    return [[name for name, fake in numeric.fakes(r, e, flat_tensors(inputs), fixed.get(j) if r.numel() == 1 else None).items()
             if numeric.compare(fake, r, e)["ok"]] for j, (r, e) in enumerate(zip(truth, eager))]


def _sync_buffers(model64, values: dict) -> None:
    """The float64 copy's buffers set to `values` (Model's, by name)."""
    import torch
    if model64 is None:
        return
    with torch.no_grad():
        for k, b in model64.named_buffers():
            if k in values and b.shape == values[k].shape:
                b.copy_(values[k])


def variant_job(job: dict) -> dict:
    """Fresh inputs for the opening's variants[index], Model's outputs on them, kept here; the
    inputs shared."""
    import torch
    _RUN["trial"] = None
    if _RUN["device"] == "cuda":
        torch.cuda.ipc_collect()     # memory the candidate has let go of
        torch.cuda.empty_cache()
    model, variant, notes = _RUN["model"], _RUN["variants"][job["index"]], []
    # Model's buffers before this call: the float64 copy starts its call from them too (Model's
    # timing calls move a training-mode BatchNorm's statistics; the copy's would lag behind)
    before = {k: v.detach().clone() for k, v in model.named_buffers()}
    inputs, _ = _draw(variant)
    try:
        eager, ops = _eager(model, inputs)
        if variant == SIGNED and not _finite(eager):
            raise ValueError("not finite")
    except Exception as e:
        if variant == VARIANTS[0]:
            raise
        why = ("Model's output is not finite on these inputs (its domain is non-negative)" if str(e) == "not finite"
               else f"Model raised {type(e).__name__} on these inputs")
        notes.append(f"{variant}: {why}; drew {VARIANTS[0]} instead")
        variant = VARIANTS[0]
        inputs, _ = _draw(variant)
        eager, ops = _eager(model, inputs)
    # Model's state after its first call, before anything else runs it (the eager timing below runs
    # it again, as the candidate's timing does ModelNew): what ModelNew's first call must leave
    _RUN["state_after"] = ({k: v.detach().clone() for k, v in model.named_buffers()} if job["index"] == 0
                           else None)
    _sync_buffers(_RUN["model64"], before)
    truth, how = _float64(model, _RUN["model64"], inputs, eager, _RUN["device"])
    # the float64 copy's state after the same first call, in one piece: the truth for Model's
    # running statistics, which eager's own TF32 convs round (ResNet18's deep BatchNorms)
    _RUN["state64_after"] = ({k: v.detach().clone() for k, v in _RUN["model64"].named_buffers()}
                             if job["index"] == 0 and how == "on the device" and truth is not None else None)
    if truth is None or len(truth) != len(eager):
        notes.append(f"{how}: outputs are judged against eager PyTorch")
        truth = None
    elif how != "on the device":
        notes.append(f"float64 ground truth computed {how}")
    judged_by = truth or eager
    loose = _loose(judged_by, eager, inputs)
    result = {"variant": variant, "notes": notes, "ops": dict(ops), "float64": truth is not None,
              "nbytes": sum(t.numel() * t.element_size() for t in flat_tensors(inputs) + eager),
              "out_bytes": sum(t.numel() * t.element_size() for t in eager),
              "outputs": [{"shape": list(e.shape), "dtype": str(e.dtype)} for e in eager],
              "loose": loose,
              # a pass over the output only where zeros or a constant already passes the tolerance
              "constant": [numeric.exact_constant(r) if {"zeros", "a constant"} & set(names) else None
                           for r, names in zip(judged_by, loose)],
              "rounding_zero": [truth is not None and "zeros" in names and numeric.rounding_zero(r, e)
                                for r, e, names in zip(judged_by, eager, loose)],
              "inputs_fingerprint": [numeric.fingerprint(x) for x in flat_tensors(inputs) if x.is_floating_point()]}
    if _RUN["time"] and _RUN["device"] == "cuda" and _RUN["eager_ms"] is None:
        from mtmc.tools.timing import bench_ms
        x = to_device(inputs, "cuda")   # timed on a copy: the inputs must stay as drawn
        with torch.no_grad():
            _RUN["eager_ms"] = bench_ms(lambda: model(*x))
        del x
    result["eager_ms"] = _RUN["eager_ms"]
    _RUN["trial"] = {"inputs": inputs, "eager": eager, "truth": judged_by}
    result["payload"] = share(inputs, job["dir"], f"inputs{job['index']}")
    return result


def _same_bits(a, b) -> bool:
    import torch
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a == b
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    return bool(torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))


def _judge_outputs(outs: list) -> list[dict]:
    """Each candidate output against the truth: compare, precision, format, fingerprint."""
    trial, results = _RUN["trial"], []
    # the user allowed TF32 products (optimize --allow-tf32): a TF32-sized error is within the bound
    tf32 = _RUN.get("tf32", False)
    for j, (r, e) in enumerate(zip(trial["truth"], trial["eager"])):
        o = outs[j] if j < len(outs) else None
        if o is None:
            results.append({"compare": {"ok": False, "reason": "not a plain tensor", "max_abs_err": float("inf"),
                                        "rel_err": float("inf"), "tol_ratio": float("inf")},
                            "precision": None, "format": [], "fingerprint": None})
            continue
        fmt = []
        if o.shape != e.shape:
            fmt.append(f"output {j} has shape {tuple(o.shape)}, Model's {tuple(e.shape)}")
        if o.dtype != e.dtype:
            fmt.append(f"output {j} is {o.dtype}, Model's {e.dtype}")
        if o.device != e.device:
            o = o.to(e.device)
        results.append({"compare": numeric.compare(o, r, e, numeric.TF32_MODULE_SCALE if tf32 else 1.0),
                        "precision": numeric.precision_loss(o, r, e, allowed=tf32),
                        "format": fmt, "fingerprint": numeric.fingerprint(o) if o.is_floating_point() else None})
    return results


def judge_job(job: dict) -> dict:
    """The candidate's outputs of this variant (and its inputs after the call) judged here."""
    trial = _RUN.get("trial")
    if trial is None:
        raise RuntimeError("no reference variant is ready to judge against")
    got = receive(job["payload"], job.get("limit_bytes"))
    outs = list(got.get("outputs") or [])
    result = {"count": len(outs), "outputs": _judge_outputs(outs)}
    if "inputs_after" in got:
        given, after = flat_tensors(trial["inputs"]), flat_tensors(got["inputs_after"])
        result["inputs_changed"] = [i for i, (g, a) in enumerate(zip(given, after)) if not _same_bits(g, a)]
        if len(after) != len(given):
            result["inputs_changed"].append(f"{len(after)} of {len(given)} inputs came back")
    if got.get("state_after") is not None and _RUN.get("state_after") is not None:
        result["state_changed"] = _state_changes(got["state_after"], _RUN["state_after"], _RUN.get("state64_after"))
        _RUN["state_after"] = _RUN["state64_after"] = None
    del got, outs  # release the candidate's shared memory before it goes on
    return result


def _state_changes(after: dict, model_after: dict, truth: dict | None = None) -> list[str]:
    """Model's buffers after its first call (running statistics, a counter) against ModelNew's
    after its first: each one that differs, in words.  ModelNew took Model's state_dict, so the
    names are Model's.  Only the first call is compared: on a GPU both sides are then timed, a
    different number of calls each.  With `truth` (the float64 copy's buffers after the same
    call), a floating buffer off Model's passes when it is no further from float64 than Model's
    own (twice that, as outputs are judged): eager's TF32 convs move the statistics after them."""
    import torch
    out = []
    for name, want in model_after.items():
        got = after.get(name)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            out.append(f"{name} is missing or reshaped")
            continue
        got = got.to(want.device, want.dtype)
        if want.is_floating_point():
            if torch.allclose(got, want, rtol=1e-3, atol=1e-5, equal_nan=True):
                continue
            exact = truth.get(name) if truth else None
            if isinstance(exact, torch.Tensor) and exact.shape == want.shape:
                exact = exact.to(want.device, torch.float64)
                mine = float((got.double() - exact).abs().max())
                theirs = float((want.double() - exact).abs().max())
                if mine <= max(2.0 * theirs, 1e-5 + 1e-3 * float(exact.abs().max())):
                    continue
                out.append(f"{name} (max abs difference {float((got - want).abs().max()):.3g}; from float64 "
                           f"{mine:.3g}, Model's own {theirs:.3g})")
                continue
            out.append(f"{name} (max abs difference {float((got - want).abs().max()):.3g})")
        elif not torch.equal(got, want):
            out.append(f"{name} ({got.flatten()[:1].tolist()} where Model has {want.flatten()[:1].tolist()})")
    return out


def close_job(job: dict) -> dict:
    _RUN.clear()
    return {}
