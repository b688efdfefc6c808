"""The report of a module optimization: a JSON summary and the markdown built from it.

Per group: its ops, kernel or PyTorch fallback (and why), correctness, time before (PyTorch
eager on the group) and after (the kernel), measured on a GPU or estimated without one; then the
end-to-end check and speedup, the ops left to PyTorch, and the parts that could not be captured.
"""
from __future__ import annotations

from mtmc.kernels.catalog import describe
from mtmc.kernels.spec import KernelSpec
from mtmc.tools.guard import numeric


def summary_json(file: str, out: str, status: str, captured: dict, part, outcomes: dict[int, dict],
                 check: dict, timing: dict | None, gpu: bool, rewrites: dict | None = None) -> dict:
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
            "library_decision": o.get("library_decision"),
        })
    return {"status": status, "file": file, "out": out, "gpu": gpu, "groups": groups,
            "torch_ops": part.torch_ops, "uncaptured": captured.get("problems", []),
            "inputs": captured.get("inputs", []), "check": check, "end_to_end": timing,
            "rewrites": {k: (rewrites or {}).get(k, []) for k in ("applied", "refused", "decisions")}}


def _gain(r: dict) -> str:
    p = r.get("predicted") or {}
    if not p:
        return ""
    b, a = p["before"], p["after"]
    return (f"predicted on the {p.get('hardware', 'H200')} roofline: {b['flops']:.3g} -> {a['flops']:.3g} flops, "
            f"{b['bytes']:.3g} -> {a['bytes']:.3g} bytes, {b['launches']} -> {a['launches']} launches, "
            f"{b['ms'] * 1e3:.1f} -> {a['ms'] * 1e3:.1f} us ({'gain' if p['gain_ms'] > 0 else 'loss'} "
            f"{abs(p['gain_ms']) * 1e3:.1f} us)")


def rewrite_lines(r: dict) -> list[str]:
    """One rewrite record in words: what it replaced and with what, why, its predicted and
    measured effect."""
    where = f" in `{r['graph']}`" if r.get("graph") else ""
    head = {"applied": "applied", "refused": "refused", "not applied": "not applied",
            "reverted": "applied, then reverted"}.get(r.get("status"), r.get("status", ""))
    lines = [f"- **{r['rule']}** ({head}){where}: {' -> '.join(r['ops'])}"
             + (f" becomes {r['result']}" if r.get("result") and r.get("status") != "refused" else "")]
    lines.append(f"  - why: {r['reason']}")
    if r.get("why_not"):
        lines.append(f"  - not kept: {r['why_not']}")
    if _gain(r):
        lines.append(f"  - {_gain(r)}")
    if r.get("status") in ("applied", "reverted"):
        m = r.get("measured")
        lines.append(f"  - measured: {m}" if m else "  - measured: not on its own (the whole-module check proves it; "
                     "timing needs a GPU)")
    return lines


def rewrite_answer(question: str, summary: dict) -> list[str]:
    """The graph-stage rewrites a why-question names (by rule, op or word), or all of them."""
    rw = summary.get("rewrites") or {}
    records = list(rw.get("applied") or []) + list(rw.get("refused") or [])
    if not records:
        return []
    words = {w for w in "".join(c if c.isalnum() else " " for c in question.lower()).split() if len(w) > 2}
    quiet = {"why", "did", "you", "the", "rewrite", "rewrote", "rewritten", "not", "was", "this", "that", "what"}
    words -= quiet

    def named(r: dict) -> bool:
        text = " ".join([r["rule"], *r["ops"], r.get("result", ""), r["reason"]]).lower()
        return any(w in text for w in words)
    hit = [r for r in records if named(r)] or records
    lines = ["Graph-stage rewrites (decided on the captured graph before the fusion groups; each applied one "
             "was proved by the whole-module check against the float64 Model):"]
    for r in hit:
        lines += rewrite_lines(r)
    return lines


def replay_answer(question: str, summary: dict) -> list[str]:
    """The launch-overhead action's decision, when a why-question is about it (a CUDA graph, a
    replay, launches)."""
    rp = summary.get("replay")
    q = question.lower()
    if not rp or not any(w in q for w in ("graph", "replay", "launch")):
        return []
    return [f"CUDA graph replay of the whole forward (the launch-overhead action): {replay_words(rp)}."]


def replay_words(rp: dict) -> str:
    """The replay decision in words: its status, both times where measured, why."""
    times = (f" (plain {_ms(rp['plain_ms'])}, replayed {_ms(rp['replay_ms'])})"
             if rp.get("plain_ms") and rp.get("replay_ms") else "")
    return f"{rp['status']}{times}: {rp['why']}"


def _ms(v) -> str:
    return f"{v:.4f} ms" if isinstance(v, (int, float)) else "-"


def _group_row(g: dict, gpu: bool) -> str:
    ops = " -> ".join(g["ops"])
    if g["status"] == "kernel":
        cfg = ", ".join(f"{k}={v}" for k, v in (g["config"] or {}).items())
        kernel = f"Triton {g['family']}/{g['op']} ({cfg})"
        if g.get("same_as") is not None:
            kernel += f", same kernel as group {g['same_as']}"
        if g.get("library_decision"):   # cuDNN with the tail on its own was weighed against it
            kernel += f"; {g['library_decision']}"
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
    if s.get("tf32"):
        lines += [f"**Precision**: TF32 products allowed (--allow-tf32): fp32 conv and matmul groups multiply "
                  f"in TF32, and the module check's fp32 tolerance was widened {numeric.TF32_MODULE_SCALE:g}x to "
                  "match.", ""]
    rp = s.get("replay")
    if rp:   # the launch-overhead action (module.graph_replay)
        lines += [f"**CUDA graph replay of the whole forward**: {replay_words(rp)}.", ""]
    rw = s.get("rewrites") or {}
    if rw.get("applied") or rw.get("refused"):
        lines += ["## Graph-stage rewrites", ""]
        for r in [*rw.get("applied", []), *rw.get("refused", [])]:
            lines += rewrite_lines(r)
        lines.append("")
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
