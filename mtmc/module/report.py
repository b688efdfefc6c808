"""The report of a module optimization: a JSON summary and the markdown built from it.

Per group: its ops, kernel or PyTorch fallback (and why), correctness, time before (PyTorch
eager on the group) and after (the kernel), measured on a GPU or estimated without one; then the
end-to-end check and speedup, the ops left to PyTorch, and the parts that could not be captured.
"""
from __future__ import annotations

from mtmc.kernels.catalog import describe
from mtmc.kernels.spec import KernelSpec


def summary_json(file: str, out: str, status: str, captured: dict, part, outcomes: dict[int, dict],
                 check: dict, timing: dict | None, gpu: bool) -> dict:
    groups = []
    for g in part.groups:
        o = outcomes.get(g.id, {})
        corr = o.get("correctness") or {}
        groups.append({
            "id": g.id, "graph": g.graph, "ops": g.ops, "family": g.family, "op": g.spec["op"],
            "description": describe(KernelSpec.from_dict(g.spec)), "spec": g.spec,
            "status": o.get("status", "fallback"), "reason": o.get("reason", ""), "same_as": o.get("same_as"),
            "config": o.get("config"), "correctness": corr.get("reason"), "max_rel_err": corr.get("max_rel_err"),
            "time_before_ms": o.get("eager_ms"), "time_after_ms": o.get("time_ms"),
            "compile_ms": o.get("compile_ms"), "measured": bool(o.get("measured")), "notes": g.notes,
        })
    return {"status": status, "file": file, "out": out, "gpu": gpu, "groups": groups,
            "torch_ops": part.torch_ops, "uncaptured": captured.get("problems", []),
            "inputs": captured.get("inputs", []), "check": check, "end_to_end": timing}


def _ms(v) -> str:
    return f"{v:.4f} ms" if isinstance(v, (int, float)) else "-"


def _group_row(g: dict, gpu: bool) -> str:
    ops = " -> ".join(g["ops"])
    if g["status"] == "kernel":
        cfg = ", ".join(f"{k}={v}" for k, v in (g["config"] or {}).items())
        kernel = f"Triton {g['family']}/{g['op']} ({cfg})"
        if g.get("same_as") is not None:
            kernel += f", same kernel as group {g['same_as']}"
    else:
        kernel = f"PyTorch (fallback: {g['reason']})"
    corr = g["correctness"] or "-"
    if g["max_rel_err"] is not None:
        corr += f"; max err {g['max_rel_err']:.2g} of tolerance"
    before = _ms(g["time_before_ms"]) if g["measured"] else "not measured (no GPU)"
    after = _ms(g["time_after_ms"]) + ("" if g["measured"] else " (roofline estimate)")
    if g["status"] != "kernel" and g["time_after_ms"] is None:
        after = "-"
    speed = (f"{g['time_before_ms'] / g['time_after_ms']:.2f}x" if g["measured"] and g["time_before_ms"]
             and g["time_after_ms"] else "-")
    return f"| {g['id']} | {ops} | {kernel} | {corr} | {before} | {after} | {speed} |"


def markdown_report(s: dict) -> str:
    lines = [f"# MTMC Kernel Agent: optimization of `{s['file']}`", "",
             f"ModelNew written to `{s['out']}` (status: {s['status']}).", ""]
    check = s["check"]
    lines += [f"**Whole-module check** ({check.get('device', 'cpu' if not s['gpu'] else 'cuda')}"
              f"{', Triton interpreter' if not s['gpu'] else ''}): {check['status']}: {check.get('reason', '')}"]
    lines += [f"- {n}" for n in (check.get("verdict") or {}).get("notes", [])]
    lines.append("")
    e2e = s.get("end_to_end")
    if e2e and e2e.get("measured"):
        comp = (f"torch.compile {_ms(e2e['compiled_ms'])} ({e2e['speedup_vs_compiled']:.2f}x)"
                if e2e.get("compiled_ms") else f"torch.compile: {e2e.get('compiled_note')}")
        lines += [f"**End to end** on {e2e['device']}: ModelNew {_ms(e2e['ours_ms'])}; PyTorch eager "
                  f"{_ms(e2e['eager_ms'])} (speedup {e2e['speedup_vs_eager']:.2f}x); {comp}. {e2e['label']}.", ""]
    elif e2e:
        lines += [f"**End to end**: not measured ({e2e.get('error')}).", ""]
    else:
        lines += ["**End to end**: no GPU, so speed was not measured and could not decide anything: every group "
                  "the catalog serves got its kernel. Per-group times below are roofline estimates.", ""]
    lines += ["## Fusion groups", "",
              "| # | ops | kernel | correctness | before (PyTorch eager) | after | speedup |",
              "|---|---|---|---|---|---|---|"]
    lines += [_group_row(g, s["gpu"]) for g in s["groups"]] or ["| - | (no group the catalog can serve) | | | | | |"]
    notes = [f"- group {g['id']}: {n}" for g in s["groups"] for n in g["notes"]]
    if notes:
        lines += ["", "Notes:", *notes]
    if s["torch_ops"]:
        lines += ["", "## Left to PyTorch", ""]
        lines += [f"- `{t['op']}`" + (f" in `{t['graph']}`" if t["graph"] else "") + f": {t['why']}"
                  for t in s["torch_ops"]]
    if s["uncaptured"]:
        lines += ["", "## Could not be captured", ""]
        for p in s["uncaptured"]:
            what = f"submodule `{p['path']}`" if p["path"] else "Model.forward itself"
            keep = ("kept as one PyTorch call" if p["path"] else
                    "it runs as written; its submodules were captured and optimized one by one")
            lines.append(f"- {what}: {p['reason']}" + (f" (at {p['where']})" if p["where"] else "") + f"; {keep}.")
    return "\n".join(lines) + "\n"
