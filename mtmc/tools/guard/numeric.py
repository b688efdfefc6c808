"""Numbers the parent judges a candidate's outputs by, against the trusted reference run.

Ground truth is Model in float64 (or eager PyTorch when Model cannot run in float64).  An output
passes correctness.judge with the output dtype's tolerance, widened by a few times eager
PyTorch's own error in that dtype: a whole module accumulates rounding that no single-kernel
bound covers, and a kernel need not beat PyTorch.  Elements where eager PyTorch itself gives
inf or NaN (the dtype cannot hold the value) are not judged.
"""
from __future__ import annotations

import math

from mtmc.tools.correctness import RTOL, judge

EAGER_ERROR_FACTOR = 4.0   # allowed multiple of eager PyTorch's own max error
HALF_BITS = 11             # significand bits of fp16 (10 stored + the implicit one)
PRECISION_FRACTION = 0.25  # an error this fraction of fp16 rounding's is "half precision"...
PRECISION_CEILING = 64.0   # ...up to this multiple (bf16 rounds 8x coarser); beyond, it is just wrong


def dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def tolerance_dtype(t) -> str:
    """The correctness.RTOL key for an output tensor (float64 is held to float32's bound)."""
    name = dtype_name(t)
    return name if name in RTOL else "float32"


def judged_mask(ref, eager):
    import torch
    return torch.isfinite(ref) & torch.isfinite(eager.to(torch.float64))


def compare(out, ref, eager) -> dict:
    """One output against its ground truth: ok, reason, max_abs_err, rel_err (max abs error over
    the largest reference magnitude), tol_ratio (worst error in units of the tolerance)."""
    import torch
    if out.shape != eager.shape:
        return {"ok": False, "reason": f"shape {tuple(out.shape)} where Model gives {tuple(eager.shape)}",
                "max_abs_err": math.inf, "rel_err": math.inf, "tol_ratio": math.inf}
    if not eager.is_floating_point():
        same = bool(torch.equal(out.cpu(), eager.cpu()))
        return {"ok": same, "reason": "equal" if same else "integer outputs differ",
                "max_abs_err": 0.0 if same else math.inf, "rel_err": 0.0 if same else math.inf,
                "tol_ratio": 0.0 if same else math.inf}
    o, r, e = (t.detach().to("cpu", torch.float64) for t in (out, ref, eager))
    mask = judged_mask(r, e)
    if not mask.any():
        return {"ok": True, "reason": "no element can be judged (PyTorch gives inf/NaN everywhere)",
                "max_abs_err": 0.0, "rel_err": 0.0, "tol_ratio": 0.0}
    o, r, e = o[mask], r[mask], e[mask]
    dt = tolerance_dtype(eager)
    slack = EAGER_ERROR_FACTOR * float((e - r).abs().max())
    ok, reason, max_abs, tol_ratio = judge(dt, o, r, r.abs() + slack / RTOL[dt])
    if not torch.isfinite(o).all():
        ok, reason, max_abs, tol_ratio = False, f"{int((~torch.isfinite(o)).sum())} output elements are " \
            "NaN or inf where PyTorch's are finite (unwritten or invalid)", math.inf, math.inf
    peak = float(r.abs().max())
    skipped = int((~mask).sum())
    if skipped:
        reason += f"; {skipped} elements not judged (PyTorch gives inf/NaN there)"
    return {"ok": ok, "reason": reason, "max_abs_err": max_abs,
            "rel_err": max_abs / peak if peak > 0 else (0.0 if max_abs == 0 else math.inf), "tol_ratio": tol_ratio}


def _rms(t) -> float:
    return float(t.pow(2).mean().sqrt()) if t.numel() else 0.0


def half_rounding(ref):
    """ref with its significand rounded to fp16's 11 bits (no range limits: fp16's precision,
    not its overflow, is what a reduced-precision kernel loses everywhere)."""
    import torch
    m, e = torch.frexp(ref)
    return torch.ldexp(torch.round(m * 2**HALF_BITS) / 2**HALF_BITS, e)


def precision_loss(out, ref, eager) -> dict | None:
    """For a float32 (or float64) output: the candidate's RMS error against fp16 rounding's and
    eager PyTorch's.  "reduced" when it is a sizeable fraction of fp16 rounding and well above
    eager's, but not far beyond bf16 rounding's (then it is wrong, not imprecise), i.e. the work
    was done in half precision.  None for other dtypes."""
    import torch
    if dtype_name(eager) not in ("float32", "float64") or out.shape != eager.shape:
        return None
    o, r, e = (t.detach().to("cpu", torch.float64) for t in (out, ref, eager))
    mask = judged_mask(r, e) & torch.isfinite(o)
    o, r, e = o[mask], r[mask], e[mask]
    ours, half, eager_err = _rms(o - r), _rms(half_rounding(r) - r), _rms(e - r)
    reduced = (half > 0 and PRECISION_FRACTION * half <= ours <= PRECISION_CEILING * half
               and ours > EAGER_ERROR_FACTOR * eager_err)
    return {"reduced": reduced, "rms_err": ours, "half_rms_err": half, "eager_rms_err": eager_err}


def fakes(ref, eager, inputs: list) -> dict:
    """Outputs (in the task's dtype) a check must reject: zeros, a constant (the reference's
    mean) and a copy of each input with the output's number of elements."""
    import torch
    finite = ref[torch.isfinite(ref)].to(torch.float64)
    mean = float(finite.mean()) if finite.numel() else 0.0
    out = {"zeros": torch.zeros_like(eager), "a constant": torch.full_like(eager, mean)}
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.numel() == eager.numel() and x.is_floating_point():
            out[f"a copy of input {i}"] = x.detach().reshape(eager.shape).to(eager.dtype)
    return out


def roofline_floor_ms(nbytes: float, bandwidth_gbs: float) -> float:
    """The least time moving nbytes can take at the given bandwidth, in ms."""
    return nbytes / (bandwidth_gbs * 1e9) * 1e3
