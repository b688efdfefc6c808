"""Numbers the parent judges a candidate's outputs by, against the trusted reference run.

Ground truth is Model in float64 (or eager PyTorch when Model cannot run in float64).  An output
passes correctness.judge with the output dtype's tolerance, widened by a few times eager
PyTorch's own error in that dtype: a whole module accumulates rounding that no single-kernel
bound covers, and a kernel need not beat PyTorch.  Elements where eager PyTorch itself gives
inf or NaN (the dtype cannot hold the value) are not judged.
"""
from __future__ import annotations

import math

from mtmc.tools.correctness import ATOL_FLOOR, RTOL

# TF32 allowed (optimize --allow-tf32): the module check sees only outputs (no |a| x |b| error
# scale), and a TF32 sum's worst error over millions of outputs is ~5 sigma of 2**-11 relative
TF32_MODULE_SCALE = 64.0
EAGER_ERROR_FACTOR = 4.0   # allowed multiple of eager PyTorch's own max error
HALF_BITS = 11             # significand bits of fp16 (10 stored + the implicit one)
PRECISION_FRACTION = 0.25  # an error this fraction of fp16 rounding's is "half precision"...
PRECISION_CEILING = 64.0   # ...up to this multiple (bf16 rounds 8x coarser); beyond, it is just wrong


CHUNK = 1 << 24  # elements per float64 pass: outputs of many GB are judged in place, 128 MB at a time


def dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def tolerance_dtype(t) -> str:
    """The correctness.RTOL key for an output tensor (float64 is held to float32's bound)."""
    name = dtype_name(t)
    return name if name in RTOL else "float32"


def _slices(numel: int):
    for start in range(0, numel, CHUNK):
        yield slice(start, min(numel, start + CHUNK))


def _flat(t):
    return t.detach().reshape(-1)


def _piece(x, sl, like):
    """Chunk `sl` of a flattened output as float64; `x` may be a number (a constant output)."""
    import torch
    if isinstance(x, (int, float)):
        return torch.full_like(like, float(x))
    return x[sl].to(torch.float64)


def _judged(r, e):
    import torch
    return torch.isfinite(r) & torch.isfinite(e)


def _failure(reason: str) -> dict:
    return {"ok": False, "reason": reason, "max_abs_err": math.inf, "rel_err": math.inf, "tol_ratio": math.inf}


def compare(out, ref, eager, rtol_scale: float = 1.0) -> dict:
    """One output against its ground truth: ok, reason, max_abs_err, rel_err (max abs error over
    the largest reference magnitude), tol_ratio (worst error in units of the tolerance).  `out`
    may be a number (a constant output); rtol_scale > 1 widens the dtype's tolerance (TF32 allowed:
    then the absolute floor is a whole RMS of the reference, since a TF32 product's error follows
    the spread of the values summed, not each output's own size).
    Works on any device, in chunks (see CHUNK)."""
    import torch
    if isinstance(out, torch.Tensor) and out.shape != eager.shape:
        return _failure(f"shape {tuple(out.shape)} where Model gives {tuple(eager.shape)}")
    if not eager.is_floating_point():
        same = isinstance(out, torch.Tensor) and out.dtype == eager.dtype and bool(torch.equal(out, eager))
        return {"ok": same, "reason": "equal" if same else "integer outputs differ",
                "max_abs_err": 0.0 if same else math.inf, "rel_err": 0.0 if same else math.inf,
                "tol_ratio": 0.0 if same else math.inf}
    dt = tolerance_dtype(eager)
    rtol = RTOL[dt] * rtol_scale
    o_flat = out if not isinstance(out, torch.Tensor) else _flat(out)
    r_flat, e_flat = _flat(ref), _flat(eager)
    # pass 1: eager PyTorch's own error and the reference's size (the tolerance depends on both)
    n, eager_err, sum_sq, sum_abs, peak = 0, 0.0, 0.0, 0.0, 0.0
    for sl in _slices(r_flat.numel()):
        r, e = r_flat[sl].to(torch.float64), e_flat[sl].to(torch.float64)
        m = _judged(r, e)
        r, e = r[m], e[m]
        if r.numel():
            n += r.numel()
            eager_err = max(eager_err, float((e - r).abs().max()))
            sum_sq, sum_abs = sum_sq + float(r.pow(2).sum()), sum_abs + float(r.abs().sum())
            peak = max(peak, float(r.abs().max()))
    if n == 0:
        return {"ok": True, "reason": "no element can be judged (PyTorch gives inf/NaN everywhere)",
                "max_abs_err": 0.0, "rel_err": 0.0, "tol_ratio": 0.0}
    # the error scale is |ref| widened by a few times eager's own error (correctness.judge's bound)
    widen = EAGER_ERROR_FACTOR * eager_err / rtol
    rms = math.sqrt(max(0.0, (sum_sq + 2 * widen * sum_abs + n * widen * widen) / n))
    atol = rtol * (0.05 if rtol_scale == 1.0 else 1.0) * rms + ATOL_FLOOR[dt]
    # pass 2: the candidate against that bound
    max_abs, tol_ratio, bad, nonfinite = 0.0, 0.0, 0, 0
    for sl in _slices(r_flat.numel()):
        r, e = r_flat[sl].to(torch.float64), e_flat[sl].to(torch.float64)
        m = _judged(r, e)
        if not bool(m.any()):
            continue
        r, o = r[m], _piece(o_flat, sl, r_flat[sl].to(torch.float64))[m]
        finite = torch.isfinite(o)
        nonfinite += int((~finite).sum())
        diff = (o - r).abs()
        bound = atol + rtol * (r.abs() + widen)
        if bool(finite.any()):
            max_abs = max(max_abs, float(diff[finite].max()))
            tol_ratio = max(tol_ratio, float((diff[finite] / bound[finite]).max()))
        bad += int((diff > bound).sum())
    total, skipped = r_flat.numel(), r_flat.numel() - n
    if nonfinite:
        ok, reason = False, (f"{nonfinite} output elements are NaN or inf where PyTorch's are finite "
                             "(unwritten or invalid)")
        max_abs, tol_ratio = math.inf, math.inf
    elif bad:
        ok, reason = False, f"{bad} of {n} elements outside tolerance (max abs err {max_abs:.3g})"
    else:
        ok, reason = True, "matches the float64 reference"
    if skipped:
        reason += f"; {skipped} elements not judged (PyTorch gives inf/NaN there)"
    rel = max_abs / peak if peak > 0 else (0.0 if max_abs == 0 else math.inf)
    return {"ok": ok, "reason": reason, "max_abs_err": max_abs, "rel_err": rel, "tol_ratio": tol_ratio,
            "judged": n, "total": total}


def half_rounding(ref):
    """ref with its significand rounded to fp16's 11 bits (no range limits: fp16's precision,
    not its overflow, is what a reduced-precision kernel loses everywhere)."""
    import torch
    m, e = torch.frexp(ref)
    return torch.ldexp(torch.round(m * 2**HALF_BITS) / 2**HALF_BITS, e)


def precision_loss(out, ref, eager, allowed: bool = False) -> dict | None:
    """For a float32 (or float64) output: the candidate's RMS error against fp16 rounding's and
    eager PyTorch's.  "reduced" when it is a sizeable fraction of fp16 rounding and well above
    eager's, but not far beyond bf16 rounding's (then it is wrong, not imprecise), i.e. the work
    was done in half precision.  None for other dtypes.  allowed: the user allowed TF32 products,
    whose 10-bit mantissa rounds like fp16's (measured, never "reduced")."""
    import torch
    if dtype_name(eager) not in ("float32", "float64") or out.shape != eager.shape:
        return None
    o_flat, r_flat, e_flat = _flat(out), _flat(ref), _flat(eager)
    n, ours, half, eager_sq = 0, 0.0, 0.0, 0.0
    for sl in _slices(r_flat.numel()):
        o, r, e = (t[sl].to(torch.float64) for t in (o_flat, r_flat, e_flat))
        m = _judged(r, e) & torch.isfinite(o)
        o, r, e = o[m], r[m], e[m]
        n += r.numel()
        ours += float((o - r).pow(2).sum())
        half += float((half_rounding(r) - r).pow(2).sum())
        eager_sq += float((e - r).pow(2).sum())
    ours, half, eager_err = (math.sqrt(x / n) if n else 0.0 for x in (ours, half, eager_sq))
    reduced = (not allowed and half > 0 and PRECISION_FRACTION * half <= ours <= PRECISION_CEILING * half
               and ours > EAGER_ERROR_FACTOR * eager_err)
    return {"reduced": reduced, "rms_err": ours, "half_rms_err": half, "eager_rms_err": eager_err}


def mean(ref) -> float:
    """The finite values' mean, in float64, a slice at a time."""
    import torch
    total, count = 0.0, 0
    for sl in _slices(ref.numel()):
        r = _flat(ref)[sl].to(torch.float64)
        r = r[torch.isfinite(r)]
        total, count = total + float(r.sum()), count + r.numel()
    return total / count if count else 0.0


def exact_constant(ref) -> float | None:
    """The one value every element of a float output holds (finite), or None: Model's output
    that does not depend on the inputs' values (x - x, a softmax over a dim of size 1)."""
    import torch
    if not isinstance(ref, torch.Tensor) or not ref.is_floating_point() or ref.numel() == 0:
        return None
    flat, lo, hi = _flat(ref), math.inf, -math.inf
    for sl in _slices(flat.numel()):
        x = flat[sl].to(torch.float64)
        if not bool(torch.isfinite(x).all()):
            return None
        lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
    return lo if lo == hi else None


def rounding_zero(ref, eager) -> bool:
    """Model's true output is 0 and eager's nonzero values are its rounding: the float64 truth is
    under a thousandth of eager PyTorch's own error everywhere (the mean of a group-normed tensor
    over its channels, L2 23: 1e-17 against eager's 1e-8).  Zeros are then the right answer, not
    a loose bound's blind spot."""
    import torch
    if not isinstance(ref, torch.Tensor) or not ref.is_floating_point() or ref.shape != eager.shape:
        return False
    peak, err = 0.0, 0.0
    r_flat, e_flat = _flat(ref), _flat(eager)
    for sl in _slices(r_flat.numel()):
        r, e = r_flat[sl].to(torch.float64), e_flat[sl].to(torch.float64)
        if not bool(torch.isfinite(r).all() and torch.isfinite(e).all()):
            return False
        peak, err = max(peak, float(r.abs().max())), max(err, float((e - r).abs().max()))
    return err > 0 and peak <= 1e-3 * err


def fakes(ref, eager, inputs: list, constant: float | None = None) -> dict:
    """Outputs (in the task's dtype) a check must reject: zeros, a constant and a copy of each
    input with the output's number of elements.  The constant is the reference's mean, or
    `constant` where given: a scalar output (a loss) IS its own mean, so there the constant is
    one fixed number for every input variant (the first variant's value): a kernel returning it
    whatever the inputs must fail on some variant.  Constants are numbers (compare broadcasts
    them), so no output-sized tensor is made."""
    import torch
    value = mean(ref) if constant is None else constant
    out = {"zeros": 0.0, "a constant": float(torch.tensor(value).to(eager.dtype))}  # as the dtype holds it
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.numel() == eager.numel() and x.is_floating_point():
            out[f"a copy of input {i}"] = x.detach().reshape(eager.shape).to(eager.dtype)
    return out


def fingerprint(t) -> list[float]:
    """A cheap summary of a tensor's values (float64 sum and sum of squares): two calls that
    return the same result give the same fingerprint."""
    import torch
    flat, s, sq = _flat(t), 0.0, 0.0
    for sl in _slices(flat.numel()):
        x = flat[sl].to(torch.float64)
        s, sq = s + float(torch.nansum(x)), sq + float(torch.nansum(x * x))
    return [s, sq]


def roofline_floor_ms(nbytes: float, bandwidth_gbs: float) -> float:
    """The least time moving nbytes can take at the given bandwidth, in ms."""
    return nbytes / (bandwidth_gbs * 1e9) * 1e3
