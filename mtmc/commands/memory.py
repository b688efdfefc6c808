"""`mtmc memory search|show|why|rebuild`: the stored optimization histories."""
from __future__ import annotations

import json
import sys

from mtmc.agents.context import env_llm
from mtmc.agents.explainer import explain
from mtmc.agents.events.text import decision_line, verdict_line
from mtmc.memory import MemoryUnavailable, Store
from mtmc.tools.hardware import get_profile


def _gpu_name(name: str | None) -> str | None:
    """A profile key ("h200") or a full name ("NVIDIA H200") -> the name histories are filed under."""
    if not name:
        return None
    try:
        return get_profile(name).name
    except ValueError:
        return name


def _time(h: dict) -> str:
    ms = h.get("time_ms")
    return "no time" if ms is None else f"{ms:.4f} ms {'measured' if h.get('measured') else 'estimated'}"


def cmd_search(args) -> int:
    hits = Store().search(args.text, op=args.op, gpu=_gpu_name(args.gpu), k=args.k)
    if args.json:
        print(json.dumps(hits, indent=2))
        return 0
    if not hits:
        print("no stored histories match")
    for h in hits:
        stale = f"  [stale: {'; '.join(h['stale_reasons'])}]" if h["stale"] else ""
        print(f"{h['id']}  score={h['score']:.3f} (text distance {h['distance']:.3f})  {h['description']}  on {h['gpu']}\n"
              f"    final config {h['final_config']} at step {h['final_step']} of {h['drafts']}, {_time(h)}{stale}")
    return 0


def _record(store: Store, record_id: str):
    rec = store.get(record_id)
    if rec is None:
        print(f"mtmc: no history {record_id!r} (an id, or a prefix naming exactly one)", file=sys.stderr)
    return rec


def cmd_show(args) -> int:
    rec = _record(Store(), args.id)
    if rec is None:
        return 1
    if args.json:
        print(json.dumps(rec.to_dict(), indent=2))
        return 0
    s = rec.summary()
    print(f"{rec.id}: {s['description']}\n  request: {rec.request}\n  GPU: {rec.gpu_name}; versions: "
          f"{', '.join(f'{k} {v}' for k, v in rec.versions.items())}" + (
              f" (stale here: {'; '.join(s['stale_reasons'])})" if s["stale"] else ""))
    if rec.warm_start:
        print(f"  started from history {rec.warm_start}")
    for step in rec.steps:
        print(f"  step {step['step']} [{step.get('origin')}] {decision_line(step)}\n"
              f"      -> {step.get('outcome')}; {verdict_line(step.get('verdict') or {})}")
        if step.get("diff"):
            print("\n".join("      " + line for line in step["diff"].splitlines()))
    if rec.stop:
        print(f"  stop: {decision_line(rec.stop)}")
    speedups = ", ".join(f"{k} {v:.2f}x" for k, v in rec.speedups.items())
    print(f"  final config {rec.final_config} (step {rec.final_step}), {_time(s)}"
          + (f"; speedups: {speedups}" if speedups else ""))
    return 0


def cmd_why(args) -> int:
    store = Store()
    rec = _record(store, args.id)
    if rec is None:
        return 1
    llm = env_llm("answering from the records only")
    print(explain(args.question, rec.as_state(), store, llm=llm))
    return 0


def cmd_rebuild(args) -> int:
    n = Store().rebuild()
    print(f"rebuilt the index from the log: {n} histories")
    return 0


def cmd_merge(args) -> int:
    """Histories from other logs (another host's histories.jsonl) into this one, once each."""
    from mtmc.memory.log import HistoryLog
    store = Store()
    n = sum(store.merge(list(HistoryLog(path).records().values())) for path in args.logs)
    print(f"merged {n} new histories into {store.log.path}" + (f" (index: {store.index_note})" if store.index_note else ""))
    return 0


def _guarded(fn):
    def run(args) -> int:
        try:
            return fn(args)
        except MemoryUnavailable as exc:
            print(f"mtmc: memory index unavailable: {exc}", file=sys.stderr)
            return 2
    return run


def register(sub) -> None:
    m = sub.add_parser("memory", help="search, show and rebuild the stored optimization histories")
    msub = m.add_subparsers(dest="memory_command", required=True)
    s = msub.add_parser("search", help="histories nearest to a description")
    s.add_argument("text", help='e.g. "softmax over 4096x8192 fp16"')
    s.add_argument("--op", help="only this op family (or op name), e.g. softmax, matmul, rmsnorm")
    s.add_argument("--gpu", help="only histories tuned for this GPU (h200 or a full name)")
    s.add_argument("-k", type=int, default=5, help="how many (default 5)")
    s.add_argument("--json", action="store_true", help="print the hits as JSON")
    s.set_defaults(func=_guarded(cmd_search))
    sh = msub.add_parser("show", help="one history: every step, its reason, verdict and diff")
    sh.add_argument("id", help="a history id, or a prefix naming exactly one")
    sh.add_argument("--json", action="store_true", help="print the whole record as JSON")
    sh.set_defaults(func=_guarded(cmd_show))
    w = msub.add_parser("why", help="why a stored run made a decision: from its records (prose from an "
                                    "LLM when MTMC_LLM_BASE_URL and MTMC_LLM_MODEL are set)")
    w.add_argument("id", help="a history id, or a prefix naming exactly one")
    w.add_argument("question", help='e.g. "why step 2?", "why BLOCK_N=4096?", "why did you stop?"')
    w.set_defaults(func=_guarded(cmd_why))
    r = msub.add_parser("rebuild", help="drop the Chroma index and rebuild it from the log")
    r.set_defaults(func=_guarded(cmd_rebuild))
    mg = msub.add_parser("merge", help="add the histories of other logs (e.g. another host's histories.jsonl) "
                                       "that this one lacks")
    mg.add_argument("logs", nargs="+", help="JSON-lines history logs")
    mg.set_defaults(func=_guarded(cmd_merge))
