"""The conv family on the GPU: our kernel at its default config and a few one-knob variants,
against PyTorch eager (cuDNN) and torch.compile, at the sizes of KernelBench's level-1 conv
tasks; and the measured error against float64 of ours and of cuDNN's own fp32 conv, with TF32
on (PyTorch's default: torch.backends.cudnn.allow_tf32) and off.

  python -m bench.conv [--quick] [--dtypes float32,float16,bfloat16] [--only 55,87_pointwise]
                       [--no-variants] [--out bench/results] [--name STEM]

--quick cuts batch and spatial sizes (about 8x less work) for a first pass.  Every row is saved
as soon as it is measured (bench.record.Results), so a run cut short keeps what it measured.
Columns: ms of ours / eager (cuDNN, TF32 allowed for fp32 as PyTorch does by default) / eager
with TF32 off / torch.compile; speedups are eager / ours and compile / ours; err is the largest
|out - float64| divided by the |x| conv |w| error scale (so 1e-7 is fp32 rounding, 1e-3 is TF32),
and "tol" the same in units of the product's tolerance (<= 1 passes the fp32 rtol of 1e-4).
"""
from __future__ import annotations

import argparse
import sys

from bench.record import Results, add_output_args, gpu_profile, markdown_table, run_meta
from mtmc.kernels.families.conv import FAMILY, conv_spec

# KernelBench level-1 conv tasks (the dev set's), at their sizes: name -> conv_spec arguments
TASKS = {
    "55_conv2d_asym_input": ("conv2d", (8, 64, 512, 1024), 128, 3, {}),
    "57_convT2d": ("conv_transpose2d", (8, 64, 1024, 1024), 64, 3, {}),
    "59_conv3d_3x3x1": ("conv3d", (16, 3, 256, 256, 10), 64, (3, 3, 1), {}),
    "61_convT3d": ("conv_transpose3d", (8, 48, 64, 64, 64), 48, 3, {}),
    "63_conv2d_square": ("conv2d", (16, 16, 1024, 1024), 128, 3, {}),
    "65_convT2d_3x7": ("conv_transpose2d", (8, 64, 512, 512), 64, (3, 7), {}),
    "67_conv1d": ("conv1d", (32, 64, 131072), 128, 3, {}),
    "69_convT2d_3x5": ("conv_transpose2d", (64, 64, 128, 256), 128, (3, 5), {}),
    "71_convT2d_asym": ("conv_transpose2d", (8, 32, 512, 1024), 32, 3, {}),
    "73_convT3d_s2_g4": ("conv_transpose3d", (4, 32, 32, 64, 128), 32, 3, {"stride": 2, "padding": 1, "groups": 4}),
    "75_convT2d_s23_g4_d21": ("conv_transpose2d", (16, 32, 128, 256), 64, (3, 5),
                              {"stride": (2, 3), "padding": (1, 2), "dilation": (2, 1), "groups": 4}),
    "77_convT3d_s2_d2": ("conv_transpose3d", (16, 32, 16, 32, 32), 64, 3, {"stride": 2, "padding": 1, "dilation": 2}),
    "79_convT1d_s2_d2": ("conv_transpose1d", (16, 32, 131072), 64, 3, {"stride": 2, "padding": 1, "dilation": 2}),
    "81_convT2d_s5_d2": ("conv_transpose2d", (16, 32, 64, 128), 64, 3, {"stride": 5, "padding": 1, "dilation": 2}),
    "83_depthwise_3x1": ("conv2d", (64, 8, 512, 512), 8, (3, 1), {"groups": 8}),
    "85_depthwise_3x7": ("conv2d", (32, 128, 128, 256), 128, (3, 7), {"groups": 128}),
    "87_pointwise": ("conv2d", (16, 64, 1024, 1024), 128, 1, {}),
}
# one-knob moves from the default worth knowing on the GPU (illegal ones are skipped)
VARIANTS = [{"LAYOUT": "channels_last"}, {"BLOCK_M": 64}, {"BLOCK_N": 128}, {"BLOCK_K": 64}, {"num_stages": 2},
            {"num_warps": 4}, {"ALGO": "taps"}, {"ALGO": "flat"}, {"ALGO": "direct"}, {"PRECISION": "ieee"}, {"PRECISION": "tf32x3"},
            {"PRECISION": "tf32x3", "LAYOUT": "channels_last"}]


def quick_shape(x_shape: tuple) -> tuple:
    """About 8x less work: batch / 2 and the largest spatial dim / 4 (at least 1 each)."""
    x = list(x_shape)
    x[0] = max(1, x[0] // 2)
    big = max(range(2, len(x)), key=lambda i: x[i])
    x[big] = max(1, x[big] // 4)
    return tuple(x)


def spec_of(name: str, dtype: str, quick: bool):
    op, x, c_out, k, params = TASKS[name]
    return conv_spec(op, quick_shape(x) if quick else x, c_out, k, dtype=dtype, **params)


def errors(spec, source: str, device: str = "cuda") -> dict:
    """Largest |out - float64 truth| over the |x| conv |w| error scale: ours, cuDNN with TF32
    allowed (PyTorch's default for fp32 convs) and cuDNN without it; plus ours in tolerance units."""
    import torch

    from mtmc.kernels.task import task_of
    from mtmc.tools.correctness import judge, make_inputs, poisoned_output, reference_namespace
    from mtmc.tools.loader import load_source
    task = task_of(spec)
    ns = reference_namespace(task)
    inputs = make_inputs(task, spec.dims, device, seed=0)
    x64 = [x.double() for x in inputs]
    ref, scale = ns["reference"](*x64), ns["error_scale"](*x64)
    del x64
    tiny = torch.finfo(torch.float64).tiny

    def rel(out) -> float:   # a few images at a time: float64 temporaries of a whole output can take 20 GB
        step = max(1, (1 << 27) // max(1, out[0].numel()))
        return max(float(((out[i:i + step].double() - ref[i:i + step]).abs()
                          / scale[i:i + step].abs().clamp_min(tiny)).max()) for i in range(0, out.shape[0], step))
    out = poisoned_output(task, spec.dims, device)
    load_source(source, "bench_conv").launch(*inputs, out=out)
    if device == "cuda":
        torch.cuda.synchronize()
    ok, _, max_abs, tol = judge(spec.dtype, out, ref, scale)
    result = {"ours_err": rel(out), "ours_max_abs": max_abs, "ours_tol": tol, "ours_ok": ok}
    before = torch.backends.cudnn.allow_tf32
    try:
        for key, tf32 in (("cudnn_err", True), ("cudnn_strict_err", False)):
            torch.backends.cudnn.allow_tf32 = tf32
            result[key] = rel(ns["reference"](*inputs))
    finally:
        torch.backends.cudnn.allow_tf32 = before
    return result


def eager_strict_ms(spec) -> float | None:
    """cuDNN's fp32 conv with TF32 off (None for fp16/bf16, where TF32 does not apply)."""
    if spec.dtype != "float32":
        return None
    import torch

    from mtmc.kernels.task import task_of
    from mtmc.tools.correctness import make_inputs, reference_namespace
    from mtmc.tools.timing import bench_ms
    task = task_of(spec)
    reference = reference_namespace(task)["reference"]
    inputs = make_inputs(task, spec.dims, "cuda", seed=0)
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        return bench_ms(lambda: reference(*inputs))
    finally:
        torch.backends.cudnn.allow_tf32 = before


def variants_of(spec, base: dict) -> list[dict]:
    """The VARIANTS that are legal for this spec and differ from its default."""
    space = FAMILY.config_space(spec)
    return [v for v in VARIANTS if all(k in space and val in space[k] and base.get(k) != val for k, val in v.items())]


def measure(name: str, dtype: str, quick: bool, variants: bool, hw, compiled_too: bool = True) -> list[dict]:
    from mtmc.kernels.task import time_candidate
    spec = spec_of(name, dtype, quick)
    base = FAMILY.default_config(spec, hw)
    changes = [{}] + (variants_of(spec, base) if variants else [])
    rows, eager, compiled = [], None, None
    for change in changes:
        cfg = {**base, **change}
        row = {"task": name, "dtype": dtype, "dims": spec.dims, "change": change or "default", "config": cfg}
        try:
            source = FAMILY.render(spec, cfg)
            t = time_candidate(spec, source, baselines=not change, compile_baseline=compiled_too)
            if not change:
                eager, compiled = t["eager_ms"], t["compiled_ms"]
                row["eager_strict_ms"] = eager_strict_ms(spec)
                row["compiled_note"] = t["compiled_note"]
            row.update(ours_ms=t["ours_ms"], eager_ms=eager, compiled_ms=compiled, tflops=t["achieved_tflops"],
                       vs_eager=eager / t["ours_ms"] if eager else None,
                       vs_compiled=compiled / t["ours_ms"] if compiled else None)
            if not change or "PRECISION" in change:
                row.update(errors(spec, source))
        except Exception as exc:  # a config the GPU refuses: record why, keep going
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        rows.append(row)
    return rows


def _change(r: dict) -> str:
    return "default" if r["change"] == "default" else " ".join(f"{k}={v}" for k, v in r["change"].items())


COLUMNS = [("task", "task"), ("dtype", "dtype"), ("config", _change), ("ours ms", "ours_ms", ".3f"),
           ("eager ms", "eager_ms", ".3f"), ("eager no-TF32 ms", "eager_strict_ms", ".3f"),
           ("compile ms", "compiled_ms", ".3f"), ("vs eager", "vs_eager", ".2f"), ("vs compile", "vs_compiled", ".2f"),
           ("TFLOP/s", "tflops", ".1f"), ("err ours", "ours_err", ".1e"), ("err cuDNN", "cudnn_err", ".1e"),
           ("err cuDNN no-TF32", "cudnn_strict_err", ".1e"), ("tol ours", "ours_tol", ".2f"),
           ("note", lambda r: r.get("error", "")[:80])]


def table(rows: list[dict]) -> str:
    return markdown_table(rows, COLUMNS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="about 8x smaller problems")
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    p.add_argument("--only", default="", help="comma-separated task names or their number prefixes")
    p.add_argument("--no-variants", action="store_true", help="the default config only")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (tens of seconds per shape)")
    add_output_args(p)
    args = p.parse_args(argv)
    import torch
    hw = gpu_profile("bench.conv")
    if hw is None:
        return 2
    wanted = [w for w in args.only.split(",") if w]
    names = [n for n in TASKS if not wanted or any(n == w or n.split("_")[0] == w for w in wanted)]
    meta = run_meta(quick=args.quick, tf32_default=torch.backends.cudnn.allow_tf32)
    results = Results(args.out, args.name, "conv", "Conv family vs cuDNN and torch.compile", table, meta)
    rows: list[dict] = []
    for dtype in args.dtypes.split(","):
        for name in names:
            results.add(rows, measure(name, dtype, args.quick, not args.no_variants, hw, not args.no_compile))
    print(f"wrote {results.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
