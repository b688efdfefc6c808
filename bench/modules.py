"""The test modules (tests/modules/*.py) at full size, optimized end to end: the issue's table.

  python -m bench.modules [--only NAME ...] [--max-steps N] [--out bench/results] [--name NAME]

Each module file keeps its small shapes for the interpreter tests; here its top-level size
constants are replaced (FULL_SIZE) in a copy, which goes through `optimize_module` exactly like
an upload: capture in a child, the MTMC loop per group, ModelNew checked by the guard, timed
against eager and torch.compile.  The table is saved after every module.
"""
from __future__ import annotations

import argparse
import ast
import sys
import tempfile
import time
from pathlib import Path

from bench.record import Results, run_meta
from mtmc.agents.context import Context
from mtmc.agents.module_flow import optimize_module

MODULES = Path(__file__).resolve().parents[1] / "tests" / "modules"

# Sizes that fill an H200 (fp32 unless the module says otherwise), odd ones kept odd.
FULL_SIZE = {
    "mlp_gelu.py": {"batch_size": 16, "seq_len": 512, "d_model": 1024, "d_hidden": 4096},
    "linear_bias_relu.py": {"batch_size": 8192, "in_features": 4096, "out_features": 4096},
    "layernorm_residual.py": {"batch_size": 16, "seq_len": 512, "hidden": 4096},
    "scaled_masked_softmax.py": {"batch_size": 16, "heads": 16, "seq_len": 1024},
    "rmsnorm_swiglu.py": {"batch_size": 16, "seq_len": 512, "dim": 2048, "hidden": 5632},
    "conv_bias_act.py": {"batch_size": 32, "in_ch": 64, "out_ch": 128, "size": 128, "kernel": 3},
    "conv_block.py": {"batch_size": 16, "in_ch": 3, "mid_ch": 64, "out_ch": 32, "height": 224, "width": 224},
    "pool_block.py": {"N": 32, "C": 64, "H": 224, "W": 224},
    "pointred_block.py": {"batch": 8192, "feat": 4096, "hidden": 4096, "chans": 64, "side": 256},
    "cumsum_forms.py": {"batch_size": 12288, "length": 4096},
    "hinge_loss.py": {"batch_size": 32768, "input_shape": (32768,)},
    "norm_block.py": {"batch": 64, "channels": 64, "height": 128, "width": 128, "groups": 8},
    "mingpt_attention.py": {"batch_size": 128, "seq_len": 512, "n_embd": 768, "n_head": 8, "max_seqlen": 512},
    "mha_block.py": {"embed_dim": 128, "num_heads": 4, "batch_size": 2, "height": 128, "width": 128},
    "attention_block.py": {"batch_size": 8, "seq_len": 1024, "d_model": 1024, "n_heads": 16},
    "reduction_head.py": {"batch_size": 256, "seq_len": 1024, "hidden": 1024, "classes": 1000},
    "odd_shapes.py": {"dims": (31, 257, 1023), "out_features": 4093},
    "classifier_logsoftmax.py": {"batch_size": 4096, "features": 4096, "hidden": 4096, "classes": 1000},
    "elementwise_chain.py": {"shape": (64, 512, 1024)},
    "bmm_scale_residual.py": {"batch": 32, "m": 512, "k": 512, "n": 512},
    "gated_branch.py": {"rows": 8192, "dim": 2048},
    "toplevel_branch.py": {"rows": 8192, "dim": 2048},
    "gemm_swish_scale.py": {"batch_size": 8192, "in_features": 4096, "out_features": 4096},
    "layernorm_noweight.py": {"batch": 16, "seq": 512, "hidden": 4096},
    "softmax_dims.py": {"B": 32, "C": 64, "H": 128, "W": 128, "L": 16384},
    "where_forms.py": {"shape": (16, 2048, 2048)},
    "ssd_einops.py": {"batch_size": 256, "seq_length": 256, "n_heads": 8, "d_head": 64, "block_len": 64},
    "torch_aliases.py": {"batch_size": 64, "size": 256},
    "tensor_constants.py": {"batch_size": 128, "size": 256},
    "handwritten_layernorm.py": {"batch": 16, "seq": 512, "hidden": 4096},
    "gpt2_mlp.py": {"batch_size": 16, "seq_len": 1024, "n_embd": 768},
    "shape_control_flow.py": {"batch_size": 65536, "seq_len": 16},
    "conv_padding_modes.py": {"batch": 16, "size": 224, "length": 65536},
    # the graph stage's rewrites (module.graph_stage), at KernelBench level-2 sizes
    "gemm_subtract_mean.py": {"batch_size": 2048, "in_features": 8192, "out_features": 8192},
    "gemm_divide_sum.py": {"batch_size": 1024, "input_size": 8192, "hidden_size": 8192},
    "conv_bn_eval.py": {"batch_size": 64, "in_channels": 16, "out_channels": 64, "height": 256, "width": 256},
}


def resized(source: str, sizes: dict) -> str:
    """The module source with its top-level constant assignments (`a, b = 1, 2`, `x = (3, 4)`)
    set to `sizes`; every name in `sizes` must be assigned there."""
    tree = ast.parse(source)
    lines = source.splitlines()
    seen = set()
    for node in reversed(tree.body):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        names = [target.id] if isinstance(target, ast.Name) else [
            e.id for e in getattr(target, "elts", []) if isinstance(e, ast.Name)]
        if not names or not set(names) & set(sizes):
            continue
        if len(names) == 1:
            value = repr(sizes[names[0]])
        else:
            old = ast.literal_eval(node.value)
            value = ", ".join(repr(sizes.get(n, v)) for n, v in zip(names, old))
        lines[node.lineno - 1:node.end_lineno] = [f"{ast.unparse(target).strip('()')} = {value}"]
        seen |= set(names)
    missing = set(sizes) - seen
    if missing:
        raise ValueError(f"no top-level assignment of {sorted(missing)}")
    return "\n".join(lines) + "\n"


def row(name: str, s: dict) -> dict:
    e2e = s.get("end_to_end") or {}
    groups = s.get("groups", [])
    return {"module": name, "status": s.get("status"), "check": (s.get("check") or {}).get("status"),
            "check_reason": (s.get("check") or {}).get("reason", "")[:300],
            "groups": len(groups), "kernels": sum(g["status"] == "kernel" for g in groups),
            "group_detail": [{k: g.get(k) for k in ("id", "ops", "family", "status", "reason", "config",
                                                    "time_before_ms", "time_after_ms")} for g in groups],
            "ours_ms": e2e.get("ours_ms"), "eager_ms": e2e.get("eager_ms"), "compiled_ms": e2e.get("compiled_ms"),
            "speedup_vs_eager": e2e.get("speedup_vs_eager"), "speedup_vs_compiled": e2e.get("speedup_vs_compiled"),
            "message": (s.get("message") or "")[:500]}


def table(rows: list[dict]) -> str:
    f = lambda x, d=4: f"{x:.{d}f}" if isinstance(x, (int, float)) else "-"
    x = lambda v: f"{v:.2f}x" if isinstance(v, (int, float)) else "-"
    out = ["| module | correct (guard) | groups: kernel / all | ModelNew (ms) | eager (ms) | torch.compile (ms) "
           "| vs eager | vs compile |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['module']} | {r['check'] or r['status']} | {r['kernels']} / {r['groups']} | {f(r['ours_ms'])} "
                   f"| {f(r['eager_ms'])} | {f(r['compiled_ms'])} | {x(r['speedup_vs_eager'])} "
                   f"| {x(r['speedup_vs_compiled'])} |")
    out += ["", "Per group (kernel or fallback, and why):", ""]
    for r in rows:
        for g in r["group_detail"]:
            out.append(f"- {r['module']} group {g['id']} ({g['family']}: {' -> '.join(g['ops'])}): {g['status']}"
                       f" ({g['reason']}); before {f(g['time_before_ms'])} ms, after {f(g['time_after_ms'])} ms")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="*", help="module file names")
    p.add_argument("--max-steps", type=int, default=2)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--name", default=None)
    args = p.parse_args(argv)
    names = args.only or list(FULL_SIZE)
    sizes = {k: {n: list(v) if isinstance(v, tuple) else v for n, v in d.items()} for k, d in FULL_SIZE.items()}
    results = Results(args.out, args.name, "modules", "modules at full size", table,
                      run_meta(max_steps=args.max_steps, sizes=sizes))
    ctx = Context(max_steps=args.max_steps)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mtmc-modules-") as tmp:
        for name in names:
            t0 = time.time()
            src = Path(tmp) / name
            src.write_text(resized((MODULES / name).read_text(), FULL_SIZE[name]))
            try:
                s = optimize_module(str(src), ctx, str(Path(tmp) / f"new_{name}"))
            except Exception as exc:  # one module's failure must not lose the others' numbers
                s = {"status": "error", "message": f"{type(exc).__name__}: {exc}"}
            rows.append({**row(name, s), "wall_s": round(time.time() - t0, 1)})
            print(f"{name}: {rows[-1]['check']} {rows[-1]['speedup_vs_eager']} ({rows[-1]['wall_s']} s)", flush=True)
            results.save(rows)
    print(results.markdown.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
