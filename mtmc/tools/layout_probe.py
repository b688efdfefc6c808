"""One conv timed as given and channels-last on this GPU, with each layout's error against float64.

The channels-last island (module.graph_stage.layout) pays only where cuDNN's channels-last kernel
is faster *and* as exact as the one it runs as given: cuDNN picks TF32 or fp32 arithmetic per
shape and layout.  Measured on the H100 (bench/results/2026-12-06-conv-layout-precision-h100.json):
for 20 of 33 level-2 dev convs it runs TF32 in both layouts (channels-last 1.03-1.6x faster with
the input's conversion); for the other 13 it runs fp32 as given and TF32 channels-last, which the
guard's fp32 tolerance refuses, and with TF32 off channels-last is slower.  Only the conv's hyperparameters and shapes decide
that, so the probe builds the conv itself with random weights: no user code runs here.

  probe({"type": "torch.nn.modules.conv.Conv2d", "attrs": {...}, "bias": True, "input": [N, C, H, W],
         "dtype": "float32"}) -> {"nchw_ms", "cl_ms" (with the input's conversion), "nchw_err", "cl_err"}
"""
from __future__ import annotations

ERROR_SAMPLES = 4   # samples of the batch the float64 comparison uses (float64 convs are slow)
_TYPES = {f"torch.nn.modules.conv.{n}": n for n in ("Conv2d", "Conv3d", "ConvTranspose2d", "ConvTranspose3d")}
_ARGS = ("stride", "padding", "dilation", "groups", "padding_mode")


def formats(rank: int):
    import torch
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(rank)


def relative_error(conv, x, fmt, truth) -> float:
    """The largest error of conv(x[:ERROR_SAMPLES]) (in layout `fmt`, None: as given) against
    `truth`, over the largest |truth|."""
    xs = x[:ERROR_SAMPLES]
    y = conv(xs.contiguous(memory_format=fmt) if fmt is not None else xs)
    return float((y.double() - truth).abs().max() / truth.abs().max().clamp_min(1e-30))


def build(job: dict, device: str = "cuda"):
    """(conv module on `device`, a random input) for the job's description."""
    import torch
    name = _TYPES.get(job["type"])
    if name is None:
        raise ValueError(f"{job['type']} is not a 2-D or 3-D convolution")
    a = job["attrs"]
    kwargs = {k: (tuple(a[k]) if isinstance(a[k], list) else a[k]) for k in _ARGS if k in a}
    if name.startswith("ConvTranspose"):
        kwargs.pop("padding_mode", None)
        kwargs["output_padding"] = tuple(a.get("output_padding", 0))
    dtype = getattr(torch, job.get("dtype", "float32"))
    conv = getattr(torch.nn, name)(a["in_channels"], a["out_channels"], tuple(a["kernel_size"]),
                                   bias=bool(job.get("bias", True)), **kwargs)
    return conv.to(device, dtype), torch.randn(*job["input"], device=device, dtype=dtype)


def job_of(desc: dict, conv: str) -> dict | None:
    """The probe's job for conv node `conv` of a captured graph: a module conv's type, attributes
    and input; None for a functional conv (its hyperparameters are call arguments: not probed)."""
    node = next(n for n in desc["nodes"] if n["name"] == conv)
    mod = desc.get("modules", {}).get(node["target"]) if node["op"] == "call_module" else None
    if mod is None or mod.get("type") not in _TYPES:
        return None
    first = node["args"]["tuple"][0]
    source = next(n for n in desc["nodes"] if n["name"] == first.get("node"))
    tensor = source["value"].get("tensor") or {}
    return {"kind": "layout_probe", "device": "cuda", "type": mod["type"], "attrs": mod["attrs"],
            "bias": "bias" in mod.get("params", {}), "input": tensor.get("shape"),
            "dtype": tensor.get("dtype", "float32")}


def probe(job: dict) -> dict:
    import copy

    import torch

    from mtmc.tools.timing import bench_ms
    conv, x = build(job)
    fmt = formats(x.dim())
    with torch.no_grad():
        truth = copy.deepcopy(conv).double()(x[:ERROR_SAMPLES].double())
        out = {"nchw_ms": bench_ms(lambda: conv(x)), "nchw_err": relative_error(conv, x, None, truth)}
        conv_cl = conv.to(memory_format=fmt)
        out["cl_ms"] = bench_ms(lambda: conv_cl(x.contiguous(memory_format=fmt)))
        out["cl_err"] = relative_error(conv_cl, x, fmt, truth)
    out["gpu"] = torch.cuda.get_device_name()
    return out
