"""How the B operand's layout affects our fp32 matmul on the GPU (a diagnosis, not a product
path): the same shape as matmul (B [K, N]) and as nn.Linear (B [N, K], read transposed), at a
few configs, against PyTorch, plus the cost of transposing B once.

  python -m bench.matmul_layout [--out bench/results] [--name NAME]
"""
from __future__ import annotations

import argparse
import json
import sys

from bench.record import run_meta, save_rows
from mtmc.kernels.catalog import family_of
from mtmc.kernels.task import time_candidate
from mtmc.request.parse import parse_request
from mtmc.tools.hardware import resolve
from mtmc.tools.timing import bench_ms

REQUESTS = {"kn": "matmul 8192x4096 by 4096x4096 in {dtype}",
            "nk": "linear layer with 4096 inputs and 4096 outputs on a batch of 8192 tokens in {dtype}"}
VARIANTS = [{}, {"num_warps": 4}, {"BLOCK_K": 16}, {"BLOCK_K": 64, "num_stages": 2}, {"BLOCK_M": 64}]


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="bench/results")
    p.add_argument("--name", default=None)
    p.add_argument("--dtype", default="fp32")
    args = p.parse_args(argv)
    import torch
    rows = []
    for layout, req in REQUESTS.items():
        spec = parse_request(req.format(dtype=args.dtype)).spec
        fam = family_of(spec)
        base = fam.default_config(spec, resolve("auto"))
        for change in VARIANTS:
            cfg = {**base, **change}
            try:
                t = time_candidate(spec, fam.render(spec, cfg), baselines=True, compile_baseline=False)
                rows.append({"layout": layout, "config": cfg, "ours_ms": t["ours_ms"], "eager_ms": t["eager_ms"],
                             "tflops": t["achieved_tflops"]})
            except Exception as exc:  # a config the GPU refuses: record why, keep going
                rows.append({"layout": layout, "config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            print(json.dumps(rows[-1]), flush=True)
    w = torch.randn(4096, 4096, device="cuda", dtype=getattr(torch, spec.dtype))
    transpose_ms = bench_ms(lambda: w.t().contiguous())
    meta = run_meta(transpose_4096x4096_ms=transpose_ms)
    save_rows(args.out, args.name or f"{meta['date'][:10]}-matmul-layout", meta, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
