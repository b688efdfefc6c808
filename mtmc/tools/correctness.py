"""Correctness of a candidate kernel source against the family's PyTorch reference.

Runs in the verifier's child process (tools.worker); never call it on untrusted source in the
app's own process.  Each call draws fresh random inputs from an unpredictable seed, fills the
output with NaN (or a sentinel for integer outputs) before the kernel runs, checks the inputs
were not modified, and judges the error against a float64 reference with per-dtype tolerances.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

from mtmc.kernels.catalog import family_of
from mtmc.kernels.loader import load_source, make_inputs, torch_dtype
from mtmc.kernels.spec import KernelSpec

# Relative tolerance against the error scale, per dtype of inputs/outputs.  fp32 assumes IEEE
# fp32 arithmetic (no tf32); fp16/bf16 allow rounding of the output plus fp32 accumulation.
RTOL = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}
# Absolute floor: half-precision subnormals are spaced 2**-24 apart, so tiny outputs (softmax
# tails) cannot be judged relatively.
ATOL_FLOOR = {"float32": 1e-30, "float16": 2.0 ** -22, "bfloat16": 1e-30}


@dataclass
class CheckResult:
    ok: bool
    reason: str
    max_abs_err: float = math.nan
    max_rel_err: float = math.nan   # max |out-ref| / tolerance-scale, in units of rtol*scale
    trials: int = 0
    dims: dict | None = None
    device: str = "cpu"

    def to_dict(self) -> dict:
        return asdict(self)


def reference_namespace(spec: KernelSpec) -> dict:
    import torch
    ns: dict = {"torch": torch, "math": math}
    exec(compile(family_of(spec).reference_source(spec), "<reference>", "exec"), ns)
    return ns


def poisoned_output(spec: KernelSpec, dims: dict, device):
    import torch
    out_arg = family_of(spec).output(spec)
    dtype = torch_dtype(out_arg.dtype or spec.dtype)
    shape = out_arg.concrete_shape(dims)
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, torch.iinfo(dtype).min, dtype=dtype, device=device)


def judge(dtype: str, out, ref, scale) -> tuple[bool, str, float, float]:
    """Compare a kernel's `dtype` output with the float64 reference; scale is the error magnitude.
    Self-contained (torch and math only): the standalone kernel files embed its source."""
    import torch
    out64 = out.detach().to("cpu", torch.float64)
    ref64 = ref.detach().to("cpu", torch.float64)
    if out64.shape != ref64.shape:
        return False, f"output shape {tuple(out64.shape)} != reference {tuple(ref64.shape)}", math.inf, math.inf
    if torch.isnan(out64).any() and not torch.isnan(ref64).any():
        n = int(torch.isnan(out64).sum())
        return False, f"{n} output elements are NaN (unwritten or invalid)", math.inf, math.inf
    rtol = RTOL[dtype]
    scale64 = scale.detach().to("cpu", torch.float64).abs().expand_as(ref64)
    rms = float(scale64.pow(2).mean().sqrt()) if scale64.numel() else 0.0
    atol = rtol * 0.05 * rms + ATOL_FLOOR[dtype]
    diff = (out64 - ref64).abs()
    bound = atol + rtol * scale64
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / bound).max()) if diff.numel() else 0.0
    bad = int((diff > bound).sum())
    if bad:
        return False, f"{bad} of {diff.numel()} elements outside tolerance (max abs err {max_abs:.3g})", max_abs, max_rel
    return True, "matches the float64 reference", max_abs, max_rel


def check(spec: KernelSpec, source: str, dims: dict | None = None, device: str = "cpu",
          trials: int = 2) -> CheckResult:
    import torch
    dims = dict(dims or spec.dims)
    module = load_source(source, "candidate")
    if not hasattr(module, "launch"):
        return CheckResult(False, "the kernel source defines no launch(*inputs, out)", dims=dims, device=device)
    ns = reference_namespace(spec)
    worst_abs, worst_rel = 0.0, 0.0
    for _ in range(trials):
        seed = int.from_bytes(os.urandom(6), "little")
        inputs = make_inputs(spec, dims, device, seed)
        before = [x.clone() for x in inputs]
        out = poisoned_output(spec, dims, device)
        module.launch(*inputs, out=out)
        if device != "cpu":
            torch.cuda.synchronize()
        for i, (x, x0) in enumerate(zip(inputs, before)):
            if not torch.equal(x, x0):
                return CheckResult(False, f"input {i} was modified by the kernel", dims=dims, device=device, trials=_ + 1)
        cpu64 = [x.to("cpu", torch.float64) if x.is_floating_point() else x.cpu() for x in inputs]
        if "compare" in ns:
            ok, reason, max_abs, max_rel = ns["compare"](out.cpu(), *cpu64)
        else:
            ref = ns["reference"](*cpu64)
            scale = ns["error_scale"](*cpu64) if "error_scale" in ns else ref.abs()
            ok, reason, max_abs, max_rel = judge(spec.dtype, out, ref, scale)
        worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
        if not ok:
            return CheckResult(False, reason, max_abs, max_rel, _ + 1, dims, device)
    return CheckResult(True, f"matches the float64 reference on {trials} fresh random inputs",
                       worst_abs, worst_rel, trials, dims, device)
