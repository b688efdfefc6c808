"""Measured speed on the GPU: the candidate against PyTorch eager and torch.compile.

All three run in one process on the same fresh random inputs, each timed as the median of
triton.testing.do_bench (CUDA events, L2 flushed before every run).  GPU only; without one the
verifier reports kernels.estimate's roofline instead, labelled as an estimate.  Runs candidate
code: call it in the verifier's child process (tools.worker).
"""
from __future__ import annotations

WARMUP_MS = 25
REP_MS = 100


def bench_ms(fn, warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS) -> float:
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def compiled_ms(fn, inputs, mode: str = "default") -> dict:
    """torch.compile(fn, mode=mode) on `inputs`: {"ms", "compile_s" (the first call), "note"};
    "ms" is None and "note" says why when compiling fails."""
    import time

    import torch
    try:
        # A fresh dynamo state per baseline: in a process that compiles many references (a bench
        # run), dynamo's recompile limits otherwise make later calls run eager silently.
        torch._dynamo.reset()
        start = time.perf_counter()
        compiled = torch.compile(fn, mode=mode)
        compiled(*inputs)   # compile outside the timed region
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        return {"ms": bench_ms(lambda: compiled(*inputs)), "compile_s": compile_s, "note": f"torch.compile ({mode} mode)"}
    except Exception as e:  # dynamo/inductor failures are a fact about the baseline, not ours
        return {"ms": None, "compile_s": None, "note": f"compile failed: {type(e).__name__}: {str(e)[:500]}"}


def _compiled_ms(reference, inputs) -> tuple[float | None, str]:
    """torch.compile of the reference: its time, or None and why it failed."""
    result = compiled_ms(reference, inputs)
    return result["ms"], result["note"]


def _ratio(base: float | None, ours: float) -> float | None:
    return base / ours if base is not None and ours > 0 else None


def time_candidate(task: dict, source: str, baselines: bool = True, compile_baseline: bool = True) -> dict:
    """Median ms of the candidate (and of eager, and torch.compile unless not `compile_baseline`,
    when `baselines`) at the task's dims (tools.correctness: a task is plain data), with speedups
    and achieved GB/s and TFLOP/s from the task's least work."""
    import torch

    from mtmc.tools.correctness import make_inputs, poisoned_output, reference_namespace
    from mtmc.tools.loader import load_source
    if not torch.cuda.is_available():
        raise RuntimeError("timing needs a CUDA GPU; use an estimate without one")
    dims = dict(task["dims"])
    module = load_source(source, "candidate")
    inputs = make_inputs(task, dims, "cuda")
    out = poisoned_output(task, dims, "cuda")
    ours = bench_ms(lambda: module.launch(*inputs, out=out))
    result = {"measured": True, "label": "measured: median of triton.testing.do_bench, L2 flushed",
              "device": torch.cuda.get_device_name(0), "dims": dims, "ours_ms": ours,
              "eager_ms": None, "compiled_ms": None, "compiled_note": "not measured",
              "speedup_vs_eager": None, "speedup_vs_compiled": None}
    if baselines:
        reference = reference_namespace(task)["reference"]
        result["eager_ms"] = bench_ms(lambda: reference(*inputs))
        if compile_baseline:
            result["compiled_ms"], result["compiled_note"] = _compiled_ms(reference, inputs)
        result["speedup_vs_eager"] = _ratio(result["eager_ms"], ours)
        result["speedup_vs_compiled"] = _ratio(result["compiled_ms"], ours)
    flops, nbytes = task["work"]["flops"], task["work"]["bytes"]
    seconds = ours * 1e-3
    result.update(flops=flops, bytes=nbytes, achieved_gbs=nbytes / seconds / 1e9,
                  achieved_tflops=flops / seconds / 1e12)
    return result
