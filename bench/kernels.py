"""Each family's default kernel on the GPU, straight from the plain-words benchmark requests
(bench.tasks, the lists bench.run names): no agent loop, so a whole op set takes minutes.

  python -m bench.kernels [--tasks spine,...] [--compile] [--out bench/results] [--name STEM]

Per request: the words parser's spec, the family's default config for this GPU, a correctness
check at the full size (fresh inputs, float64 truth, the guard's tolerance), then the median
time of ours and of PyTorch eager (and torch.compile with --compile).  The copy bandwidth of
the same GPU, measured at the start of the run, gives memory-bound kernels their yardstick:
"of copy" is our achieved GB/s over it.  Rows are saved as they come (bench.record.Results).
"""
from __future__ import annotations

import argparse
import sys

from bench.record import Results, add_output_args, gpu_profile, markdown_table, run_meta
from bench.run import TASKS


def copy_gbs(nbytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy of `nbytes` (read + write), as do_bench times it."""
    import torch

    from mtmc.tools.timing import bench_ms
    x = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def measure(text: str, hw, compiled_too: bool, copy: float) -> dict:
    from mtmc.kernels import catalog
    from mtmc.kernels.task import check, time_candidate
    from mtmc.request.parse import parse_request
    row: dict = {"request": text}
    parsed = parse_request(text)
    if parsed.spec is None:
        row["error"] = f"not parsed: {parsed.message[:200]}"
        return row
    spec = parsed.spec
    fam = catalog.family_of(spec)
    cfg = fam.default_config(spec, hw)
    row.update(family=fam.name, spec=fam.describe(spec), config=cfg)
    try:
        source = fam.render(spec, cfg)
        verdict = check(spec, source, spec.dims, device="cuda", trials=1)
        row.update(correct=verdict.ok, check=verdict.reason[:200])
        t = time_candidate(spec, source, baselines=True, compile_baseline=compiled_too)
        row.update(ours_ms=t["ours_ms"], eager_ms=t["eager_ms"], compiled_ms=t["compiled_ms"],
                   compiled_note=t.get("compiled_note"),
                   vs_eager=t["speedup_vs_eager"], vs_compiled=t["speedup_vs_compiled"],
                   gbs=t["achieved_gbs"], tflops=t["achieved_tflops"], of_copy=t["achieved_gbs"] / copy)
    except Exception as exc:  # one op the GPU refuses must not lose the others' rows
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return row


COLUMNS = [("request", "request"), ("family", "family"), ("correct", "correct"), ("ours ms", "ours_ms", ".3f"),
           ("eager ms", "eager_ms", ".3f"), ("compile ms", "compiled_ms", ".3f"), ("vs eager", "vs_eager", ".2f"),
           ("vs compile", "vs_compiled", ".2f"), ("GB/s", "gbs", ".0f"), ("of copy", "of_copy", ".0%"),
           ("TFLOP/s", "tflops", ".1f"), ("note", lambda r: r.get("error", ""))]


def table(rows: list[dict]) -> str:
    return markdown_table(rows, COLUMNS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated lists of bench.tasks: {', '.join(TASKS)}")
    p.add_argument("--compile", action="store_true", help="also time torch.compile (tens of seconds per request)")
    add_output_args(p)
    args = p.parse_args(argv)
    hw = gpu_profile("bench.kernels")
    if hw is None:
        return 2
    unknown = [t for t in args.tasks.split(",") if t not in TASKS]
    if unknown:
        p.error(f"unknown task list(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    copy = copy_gbs()
    meta = run_meta(copy_gbs=copy, tasks=args.tasks)
    results = Results(args.out, args.name, "kernels", "Default kernels of each family vs PyTorch", table, meta)
    rows: list[dict] = []
    for name in args.tasks.split(","):
        for text in TASKS[name]:
            results.add(rows, [{"list": name, **measure(text, hw, args.compile, copy)}])
    print(f"wrote {results.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
