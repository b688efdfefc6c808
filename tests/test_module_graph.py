"""The module flow as a LangGraph graph: independent groups run side by side, each group's
kernel run is checkpointed under the module run's thread, and the events say which group
they belong to."""
from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from mtmc.agents import events as E
from mtmc.agents import module_flow, module_steps
from mtmc.agents.context import Context
from mtmc.agents.state import State
from mtmc.agents.stream import emit

MODULES = Path(__file__).parent / "modules"


def _slow_kernel_graph(spans: list, lock: threading.Lock):
    """A stand-in for the kernel graph: one node that takes a second and finds no kernel."""
    def work(state: State) -> dict:
        start = time.monotonic()
        emit(E.Parsed(spec=state["spec"], description="stand-in"))
        time.sleep(1.0)
        with lock:
            spans.append((state["spec"]["op"], start, time.monotonic()))
        return {"status": "failed", "message": "stand-in: no kernel"}

    g = StateGraph(State)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g.compile()


def test_groups_run_concurrently_and_are_checkpointed(tmp_path, monkeypatch):
    spans, lock = [], threading.Lock()
    monkeypatch.setattr(module_flow, "kernel_graph", lambda: _slow_kernel_graph(spans, lock))
    # the whole-module check is the guard's (tested elsewhere): skipped here
    monkeypatch.setattr(module_steps, "reference_run", lambda *a, **k: {"status": "skipped", "reason": "test"})
    saver = SqliteSaver(sqlite3.connect(str(tmp_path / "ck.sqlite"), check_same_thread=False))
    events = []
    state = module_flow.run_module(str(MODULES / "gated_branch.py"), Context(target="h200", use_gpu=False),
                                   str(tmp_path / "new.py"), on_event=events.append, thread_id="mod-1", saver=saver)

    assert state["status"] == "done" and (tmp_path / "new.py").exists()
    # two groups of different specs side by side; the stand-in finds no kernel, so the matmul
    # group keeps cuBLAS and its tail (regroup) runs after them as a group of its own
    assert len(spans) == 3, spans
    (_, s0, e0), (_, s1, e1), (tail, s2, _) = spans
    assert s0 < e1 and s1 < e0, f"the groups ran one after the other: {spans}"
    assert tail == "chain" and s2 > max(e0, e1)

    kinds = [(e["event"], e.get("group")) for e in events]
    # the graph stage reports its rewrites (or that it made none) between capture and partition
    assert kinds[:3] == [("captured", None), ("rewritten", None), ("partitioned", None)]
    for gid in (0, 1):
        assert ("group_start", gid) in kinds and ("parsed", gid) in kinds and ("group_done", gid) in kinds
    assert kinds[-1] == ("final", None)
    assert {o["status"] for o in state["outcomes"].values()} == {"fallback"}

    config = {"configurable": {"thread_id": "mod-1"}}
    spaces = {c.config["configurable"].get("checkpoint_ns", "") for c in saver.list(config)}
    groups = {ns for ns in spaces if ns.startswith("group:")}
    assert len(groups) == 3, spaces                        # each group's run (the tail's too) has checkpoints of its own
    snap = module_flow.build_module_graph().compile(checkpointer=saver).get_state(config)
    assert snap.values["summary"]["status"] == "done" and not snap.next
