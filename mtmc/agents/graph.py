"""The MTMC state machine (DESIGN.md, "Data flow"):

  parse -> retrieve -> draft -> verify -+-> accept -> plan -+-> code -> verify ...
                                        |                   +-> finalize
                                        +-> debug -> code -> verify   (bounded retries)
                                        +-> rollback -> plan | finalize
  parse -> custom_draft -> ... the same loop with the model as coder and debugger, for an op
           outside the catalog (agents.custom_op: custom_verify, custom_accept, custom_plan,
           custom_code, custom_debug, custom_finalize; rollback is shared)
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from langgraph.graph import END, START, StateGraph

from mtmc.agents.coder import code, first_draft
from mtmc.agents import custom_op as C
from mtmc.agents.context import Context
from mtmc.agents.llm_debugger import custom_debug, route_after_debug as route_after_custom_debug
from mtmc.agents.debugger import debug, route_after_debug
from mtmc.agents.finalizer import finalize
from mtmc.agents.intake import parse, retrieve
from mtmc.agents.planner import plan, route_after_plan
from mtmc.agents.state import State
from mtmc.agents.verifier import accept, rollback, route_after_rollback, route_after_verify, verify
from mtmc.tools.paths import home


def build_graph() -> StateGraph:
    g = StateGraph(State, context_schema=Context)
    for name, fn in [("parse", parse), ("retrieve", retrieve), ("draft", first_draft), ("plan", plan),
                     ("code", code), ("verify", verify), ("accept", accept), ("debug", debug),
                     ("rollback", rollback), ("finalize", finalize),
                     ("custom_draft", C.custom_draft), ("custom_verify", C.custom_verify),
                     ("custom_accept", C.custom_accept), ("custom_plan", C.custom_plan), ("custom_code", C.custom_code),
                     ("custom_debug", custom_debug), ("custom_finalize", C.custom_finalize)]:
        g.add_node(name, fn)
    g.add_edge(START, "parse")
    g.add_conditional_edges("parse", route_after_parse, ["retrieve", "custom_draft", END])
    g.add_edge("retrieve", "draft")
    g.add_edge("draft", "verify")
    g.add_conditional_edges("verify", route_after_verify, ["accept", "debug", "rollback"])
    g.add_edge("accept", "plan")
    g.add_conditional_edges("plan", route_after_plan, ["code", "finalize"])
    g.add_edge("code", "verify")
    g.add_conditional_edges("debug", route_after_debug, ["code", "rollback"])
    g.add_conditional_edges("rollback", lambda s: ("custom_" if s.get("custom") else "") + route_after_rollback(s),
                            ["plan", "finalize", "custom_plan", "custom_finalize"])
    g.add_edge("finalize", END)
    # the custom branch (an op outside the catalog, with a model configured)
    g.add_conditional_edges("custom_draft", C.route_after_draft, ["custom_verify", "custom_finalize"])
    g.add_conditional_edges("custom_verify", C.route_after_verify, ["custom_accept", "custom_debug", "rollback"])
    g.add_edge("custom_accept", "custom_plan")
    g.add_conditional_edges("custom_plan", C.route_after_plan, ["custom_code", "custom_finalize"])
    g.add_edge("custom_code", "custom_verify")
    g.add_conditional_edges("custom_debug", route_after_custom_debug, ["custom_code", "rollback"])
    g.add_edge("custom_finalize", END)
    return g


def route_after_parse(state: State) -> str:
    if state.get("status") != "running":
        return END
    return "custom_draft" if state.get("custom") else "retrieve"


def checkpointer(path: str | Path | None = None):
    """A durable SQLite checkpointer (one row per step of every thread)."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    conn = sqlite3.connect(str(path or home() / "checkpoints.sqlite"), check_same_thread=False)
    return SqliteSaver(conn)


def compile_graph(saver=None):
    return build_graph().compile(checkpointer=saver)


def recursion_limit(ctx: Context) -> int:
    # Each planner move costs plan+code+verify+accept; each debug fix debug+code+verify.
    return 20 + 6 * (ctx.max_steps + 1) * (ctx.max_debug + 2)
