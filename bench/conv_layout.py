"""How the memory layout changes PyTorch's own (cuDNN) convolutions on the GPU (a diagnosis for
the library-conv path of regroup, not a product path): every nn.Conv*d / nn.ConvTranspose*d of
the KernelBench tasks in a folder, at its real input, timed as given (NCHW), in channels-last
with input and weight already converted, and channels-last with the input's conversion and the
output's conversion back to NCHW counted.  Precision is PyTorch's default (cuDNN TF32 on); the
`_ieee` columns time both layouts with TF32 off, and the `_err` columns give each one's largest
error against float64 on the first samples of the batch, relative to the largest |float64 value|
(cuDNN chooses TF32 per shape and layout: about 1e-7 means fp32 arithmetic, 1e-4-1e-3 TF32).

  python -m bench.conv_layout FOLDER [--only STR ...] [--out bench/results] [--name NAME]
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

from bench.record import run_meta, save_rows
from mtmc.tools.layout_probe import ERROR_SAMPLES, formats as _layout, relative_error as _error
from mtmc.tools.timing import bench_ms


def _conv_inputs(model, inputs):
    """(conv module, the tensor it received) for every conv the forward calls."""
    import torch
    seen = []
    kinds = (torch.nn.modules.conv._ConvNd,)
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.append((mod, args[0])))
             for m in model.modules() if isinstance(m, kinds)]
    with torch.no_grad():
        model(*inputs)
    for h in hooks:
        h.remove()
    return seen


def measure(conv, x) -> dict:
    import torch
    fmt = _layout(x.dim())
    row = {"conv": repr(conv), "input": list(x.shape)}
    with torch.no_grad():
        truth = copy.deepcopy(conv).double()(x[:ERROR_SAMPLES].double())
        row["nchw_ms"] = bench_ms(lambda: conv(x))
        row["nchw_err"] = _error(conv, x, None, truth)
        if fmt is None:  # 1-D convs have no channels-last format
            return row
        x_cl = x.contiguous(memory_format=fmt)
        conv_cl = conv.to(memory_format=fmt)
        row["cl_ms"] = bench_ms(lambda: conv_cl(x_cl))
        row["cl_err"] = _error(conv_cl, x, fmt, truth)
        row["cl_with_copies_ms"] = bench_ms(lambda: conv_cl(x.contiguous(memory_format=fmt)).contiguous())
        row["input_copy_ms"] = bench_ms(lambda: x.contiguous(memory_format=fmt))
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            row["cl_ieee_ms"] = bench_ms(lambda: conv_cl(x_cl))
            row["cl_ieee_err"] = _error(conv_cl, x, fmt, truth)
            conv.to(memory_format=torch.contiguous_format)
            row["nchw_ieee_ms"] = bench_ms(lambda: conv(x))
            row["nchw_ieee_err"] = _error(conv, x, None, truth)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--name", default=None)
    args = p.parse_args(argv)
    import torch
    import runpy
    rows, model, inputs = [], None, None
    for path in sorted(Path(args.folder).rglob("*.py")):
        if args.only and not any(s in str(path) for s in args.only):
            continue
        text = path.read_text()
        if "Conv" not in text:
            continue
        try:
            ns = argparse.Namespace(**runpy.run_path(str(path)))
            torch.manual_seed(0)
            model = ns.Model(*ns.get_init_inputs()).cuda()
            inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in ns.get_inputs()]
            for conv, x in _conv_inputs(model, inputs)[:4]:
                rows.append({"task": str(path.relative_to(args.folder)), **measure(conv, x)})
                print(json.dumps(rows[-1]), flush=True)
        except Exception as exc:  # a task that does not fit or fails: record why, keep going
            rows.append({"task": str(path.relative_to(args.folder)), "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            print(json.dumps(rows[-1]), flush=True)
        finally:
            model = inputs = None
            torch.cuda.empty_cache()
    meta = run_meta()
    save_rows(args.out, args.name or f"{meta['date'][:10]}-conv-layout-{meta['gpu'].split()[1].lower()}", meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
