"""Correctness of a candidate kernel source against the task's PyTorch reference.

A task is plain data built by the caller (kernels.task): the dims, the dtype, each input's
shape (dim names or sizes), dtype and init, the output, the reference source and the least work.
Runs in the verifier's child process (tools.worker); never call it on untrusted source in the
app's own process.  Each call draws fresh random inputs from an unpredictable seed, fills the
output with NaN (or a sentinel for integer outputs) before the kernel runs, checks the inputs
were not modified, and judges the error against a float64 reference with per-dtype tolerances,
computed on the device the kernel ran on (in fp32 there, then on the host, when float64 does not
fit; inputs over CLONE_LIMIT_BYTES are checked unchanged by a checksum of their bits).
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import asdict, dataclass

from mtmc.tools.loader import concrete_init, load_source, random_tensor, torch_dtype

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


def concrete_shape(shape, dims: dict, groups: int = 1) -> tuple[int, ...]:
    """A tensor's shape at `dims`: dim names replaced by their sizes; "NAME/G" is NAME's size over
    the groups (a grouped conv's weight)."""
    def one(d):
        if isinstance(d, int):
            return d
        name, _, per = d.partition("/")
        return int(dims[name]) // (groups if per else 1)
    return tuple(one(d) for d in shape)


def reference_namespace(task: dict) -> dict:
    import torch
    ns: dict = {"torch": torch, "math": math}
    exec(compile(task["reference"], "<reference>", "exec"), ns)
    return ns


def make_inputs(task: dict, dims: dict | None = None, device="cpu", seed: int | None = None):
    """Fresh random inputs of the task at `dims` (default: the task's), drawn on `device`."""
    import torch
    dims = dims or task["dims"]
    gen = torch.Generator(device=device).manual_seed(seed if seed is not None else int.from_bytes(os.urandom(6), "little"))
    return [random_tensor(concrete_shape(a["shape"], dims, a.get("groups", 1)), a["dtype"], concrete_init(a["init"], dims), gen,
                          device) for a in task["inputs"]]


def poisoned_output(task: dict, dims: dict, device):
    import torch
    out_arg = task["output"]
    dtype = torch_dtype(out_arg["dtype"])
    shape = concrete_shape(out_arg["shape"], dims, out_arg.get("groups", 1))
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, torch.iinfo(dtype).min, dtype=dtype, device=device)


def judge(dtype: str, out, ref, scale) -> tuple[bool, str, float, float]:
    """Compare a kernel's `dtype` output with the float64 reference; scale (broadcastable to it)
    is the error magnitude.  Runs on the tensors' device, a slab of leading rows at a time, so
    multi-GB outputs need no multi-GB temporaries.
    Self-contained (torch and math only): the standalone kernel files embed its source."""
    import torch
    if tuple(out.shape) != tuple(ref.shape):
        return False, f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}", math.inf, math.inf
    out, ref = out.detach().reshape(ref.shape or (1,)), ref.detach().reshape(ref.shape or (1,))
    scale = scale.detach().to(ref.device)
    scale = scale.reshape((1,) * (ref.dim() - scale.dim()) + tuple(scale.shape)) if scale.dim() < ref.dim() else scale
    rows, per_row = ref.shape[0], max(1, ref.numel() // max(1, ref.shape[0]))
    step = max(1, (1 << 24) // per_row)

    # A true value past the output dtype's largest finite one rounds to inf there (PyTorch's own
    # fp16 prod of 48 values overflows so): an inf of its sign, near that edge, is the right answer.
    top = torch.finfo(out.dtype).max if out.is_floating_point() else math.inf

    def slab(a):
        s = scale[a:a + step] if scale.shape[0] == rows else scale
        return out[a:a + step].to(torch.float64), ref[a:a + step].to(torch.float64), s.abs().to(torch.float64)
    square_sum, n = 0.0, ref.numel()
    for a in range(0, rows, step):
        o, r, s = slab(a)
        square_sum += float(s.expand_as(r).pow(2).sum())
    rtol = RTOL[dtype]
    atol = rtol * 0.05 * math.sqrt(square_sum / n) + ATOL_FLOOR[dtype] if n else ATOL_FLOOR[dtype]
    max_abs, max_rel, bad, nan = 0.0, 0.0, 0, 0
    for a in range(0, rows, step):
        o, r, s = slab(a)
        nan += int((torch.isnan(o) & ~torch.isnan(r)).sum())
        bound = atol + rtol * s
        rounds_to_inf = torch.isinf(o) & (torch.sign(o) == torch.sign(r)) & (r.abs() + bound >= top)
        diff = torch.where(rounds_to_inf, 0.0, (o - r).abs())
        bad += int((diff > bound).sum())
        if diff.numel():
            max_abs = max(max_abs, float(torch.nan_to_num(diff, nan=0.0).max()))
            max_rel = max(max_rel, float(torch.nan_to_num(diff / bound, nan=0.0).max()))
    if nan:
        return False, f"{nan} output elements are NaN (unwritten or invalid)", math.inf, math.inf
    if bad:
        return False, f"{bad} of {n} elements outside tolerance (max abs err {max_abs:.3g})", max_abs, max_rel
    return True, "matches the float64 reference", max_abs, max_rel


@contextlib.contextmanager
def ieee_fp32():
    """PyTorch's fp32 convs and matmuls in IEEE fp32 inside the block.  cuDNN runs fp32 convs on
    TF32 tensor cores by default (torch.backends.cudnn.allow_tf32), ~1e-3 relative error: ten
    times the fp32 tolerance, so an fp32 reference made so rejected a correct conv (L1 63 on an
    H100: 0.3 % of 2.1e9 outputs "wrong")."""
    import torch
    cudnn, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul


def truth_judge(ns: dict, task: dict, inputs, where, precision: str = "float64"):
    """judge(out) -> verdict against the family's float64 reference (or its own compare) of
    `inputs` on `where`; the truth is computed once, so many outputs of the same inputs (the
    configs of one spec) pay for it once.  precision "float32": the reference in fp32, for where
    float64 does not fit the device (the module's guard judges against float64 later)."""
    import torch
    wide = torch.float64 if precision == "float64" else torch.float32
    x64 = [x.to(where, wide) if x.is_floating_point() else x.to(where) for x in inputs]
    if "compare" in ns:
        return lambda out: ns["compare"](out.to(where), *x64)
    with ieee_fp32():
        ref = ns["reference"](*x64)
        scale = ns["error_scale"](*x64) if "error_scale" in ns else ref.abs()
    return lambda out: judge(task["dtype"], out.to(where), ref, scale)


def _reference_verdict(ns: dict, task: dict, out, inputs) -> tuple[bool, str, float, float, str]:
    """The family's float64 reference (or its own compare) where the data is (a multi-GB check on
    the host took minutes); where that does not fit the device, the fp32 reference there (the
    device's other tenants, the guard's sessions, hold memory too), and the host only last.  The
    last item names the fallback that judged ("" for the first choice)."""
    import torch
    tries = [(out.device, "float64")]
    if out.device.type != "cpu":
        tries += [(out.device, "float32"), (torch.device("cpu"), "float64")]
    for where, precision in tries:
        try:
            verdict = truth_judge(ns, task, inputs, where, precision)(out)
            break
        except torch.cuda.OutOfMemoryError:
            if (where, precision) == tries[-1]:
                raise
            torch.cuda.empty_cache()
    fallback = "" if (where, precision) == tries[0] else \
        f" ({precision} reference on the {'host' if where.type == 'cpu' else 'GPU'}: float64 does not fit the GPU)"
    return (*verdict, fallback)


# Inputs larger than this are not copied to check that the kernel left them alone: a checksum of
# their bits is compared instead (a copy of a 7.5 GB input pushed the float64 truth to the host).
CLONE_LIMIT_BYTES = 1 << 30


def _bits_checksum(x) -> tuple[int, int]:
    """Two checksums of a tensor's bits, a slab at a time on its device: their sum and a
    position-weighted sum (int64 arithmetic wraps; equal inputs give equal sums)."""
    import torch
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    flat = x.detach().contiguous().reshape(-1).view(ints)
    plain, weighted, step = 0, 0, 1 << 24
    for a in range(0, flat.numel(), step):
        v = flat[a:a + step].to(torch.int64)
        w = torch.arange(a, a + v.numel(), device=v.device, dtype=torch.int64) % 65521 + 1
        plain += int(v.sum())
        weighted += int((v * w).sum())
    return plain, weighted


def _snapshot(inputs: list) -> list:
    """What the in-place check compares after the launch: copies, or checksums of large inputs."""
    large = sum(x.numel() * x.element_size() for x in inputs) > CLONE_LIMIT_BYTES
    return [_bits_checksum(x) if large else x.clone() for x in inputs]


def _unchanged(x, before) -> bool:
    import torch
    return _bits_checksum(x) == before if isinstance(before, tuple) else torch.equal(x, before)


def check(task: dict, source: str, dims: dict | None = None, device: str = "cpu",
          trials: int = 2) -> CheckResult:
    import torch
    dims = dict(dims or task["dims"])
    module = load_source(source, "candidate")
    if not hasattr(module, "launch"):
        return CheckResult(False, "the kernel source defines no launch(*inputs, out)", dims=dims, device=device)
    ns = reference_namespace(task)
    worst_abs, worst_rel, fallback = 0.0, 0.0, ""
    for _ in range(trials):
        seed = int.from_bytes(os.urandom(6), "little")
        inputs = make_inputs(task, dims, device, seed)
        before = _snapshot(inputs)
        out = poisoned_output(task, dims, device)
        module.launch(*inputs, out=out)
        if device != "cpu":
            torch.cuda.synchronize()
        for i, (x, x0) in enumerate(zip(inputs, before)):
            if not _unchanged(x, x0):
                return CheckResult(False, f"input {i} was modified by the kernel", dims=dims, device=device, trials=_ + 1)
        del before
        ok, reason, max_abs, max_rel, fallback = _reference_verdict(ns, task, out, inputs)
        worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
        if not ok:
            return CheckResult(False, reason + fallback, max_abs, max_rel, _ + 1, dims, device)
    what = "reference" if fallback else "float64 reference"
    return CheckResult(True, f"matches the {what} on {trials} fresh random inputs{fallback}",
                       worst_abs, worst_rel, trials, dims, device)
