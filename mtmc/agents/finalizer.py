"""finalize node: write the kernel file and the answer in words."""
from __future__ import annotations

from pathlib import Path

from langgraph.runtime import Runtime

from mtmc.agents import events as E
from mtmc.agents.context import Context
from mtmc.agents.stream import emit
from mtmc.agents.events.text import timing_line
from mtmc.agents.state import State
from mtmc.kernels.catalog import describe
from mtmc.kernels.codegen import standalone_source
from mtmc.kernels.spec import KernelSpec
from mtmc.memory import HistoryRecord, Store, current_versions, new_id, now_iso
from mtmc.tools.paths import artifacts_dir
from mtmc.tools.hardware import resolve


def summary_text(spec: KernelSpec, best: dict, baselines: dict | None, target: str) -> str:
    verdict = best["verdict"]
    corr = verdict.get("correctness") or {}
    return "\n".join([
        f"Request: {spec.request or describe(spec)}",
        f"Target: {resolve(target).name}; config: {best['config']}",
        f"Correctness: {corr.get('reason', 'checked')} (dims {corr.get('dims')}, {corr.get('device')})",
        timing_line(verdict, baselines),
    ])


def finalize(state: State, runtime: Runtime[Context]) -> dict:
    spec = KernelSpec.from_dict(state["spec"])
    best = state.get("best") or {}
    if not best:
        msg = ("No correct kernel was found for " + describe(spec) + ". Every draft failed verification; "
               "the steps above say why.")
        emit(E.Final(status="failed", message=msg))
        return {"status": "failed", "message": msg, "history_id": None}
    summary = summary_text(spec, best, state.get("baselines"), runtime.context.target)
    path = Path(runtime.context.out_path or artifacts_dir() / f"{spec.op}_{spec.key()}.py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(standalone_source(spec, best["config"], best["source"], summary))
    record = history_record(state, spec, best, resolve(runtime.context.target))
    store = Store()
    try:
        stored = store.add(record)
        memory = f"Memory: stored as history {stored}" + (
            f" (log only, {store.index_note}; `mtmc memory rebuild` indexes it)" if store.index_note else "")
    except OSError as exc:  # the kernel is written; say plainly that the history was not kept
        stored, memory = None, f"Memory: history not stored ({exc})"
    msg = f"{describe(spec)}: best draft is step {best['step']}.\n{summary}\nKernel file: {path}\n{memory}"
    emit(E.Final(status="done", message=msg, artifact=str(path), history_id=stored))
    return {"status": "done", "message": msg, "artifact": str(path), "history_id": stored}


def history_record(state: State, spec: KernelSpec, best: dict, hw) -> HistoryRecord:
    """What memory keeps of this run (see memory.records.HistoryRecord)."""
    steps = state.get("steps", [])
    verdict = best.get("verdict") or {}
    measured = bool(verdict.get("measured"))
    baselines = state.get("baselines") or {}
    time_ms = best.get("time_ms")
    speedups = {}
    if time_ms:
        if measured:
            speedups.update({name: baselines[f"{name}_ms"] / time_ms for name in ("eager", "compile")
                             if isinstance(baselines.get(f"{name}_ms"), (int, float))})
        first = next((s for s in steps if s.get("verdict", {}).get("ok") and s.get("time_ms")), None)
        if first:  # measured, or both estimated: the ratio is like for like
            speedups["over_first_draft"] = first["time_ms"] / time_ms
    decision = state.get("decision") or {}
    return HistoryRecord(
        id=new_id(spec.to_dict()), created=now_iso(), request=spec.request or state.get("request", ""),
        spec=spec.to_dict(), gpu=hw.to_dict(), versions=current_versions(), steps=steps,
        final_config=best["config"], final_step=best["step"], source=best["source"], time_ms=time_ms,
        measured=measured, baselines=baselines, speedups=speedups,
        stop=decision if decision.get("action", {}).get("kind") == "stop" else None,
        warm_start=((steps[0].get("history") or {}).get("warm_start") if steps else None),
        llm_calls=list(state.get("llm_calls") or []))
