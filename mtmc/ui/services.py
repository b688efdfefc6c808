"""What the chat calls outside the UI, behind small adapters: the graph's checkpointed state of a
conversation, the explainer, the memory store, the module flow, an optional LLM.

Parts built alongside the UI may be missing or fail to open (no chromadb, a half-written
store); each adapter then says so in words and the rest of the app keeps working.
"""
from __future__ import annotations

import importlib


class Unavailable(RuntimeError):
    """A part of the product this app cannot use here; the message says which and why."""


def _optional(module: str, attr: str):
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise Unavailable(f"{module}.{attr} cannot be imported ({exc.__class__.__name__}: {exc})") from exc


# -- the conversation's state (the graph's checkpointer) ---------------------------------------
def thread_state(thread_id: str | None) -> dict:
    """The latest graph state of a conversation; {} before its first run."""
    if not thread_id:
        return {}
    from mtmc.agents.graph import checkpointer, compile_graph
    saver = checkpointer()
    try:
        snap = compile_graph(saver).get_state({"configurable": {"thread_id": thread_id}})
        return dict(snap.values or {})
    finally:
        saver.conn.close()


# -- memory -------------------------------------------------------------------------------------
def memory_store():
    """The memory store, or Unavailable."""
    store_cls = _optional("mtmc.memory", "Store")
    try:
        return store_cls()
    except Exception as exc:
        raise Unavailable(f"the memory store cannot be opened: {exc}") from exc


def search_history(text: str, k: int = 20) -> list[dict]:
    """Past optimizations nearest to `text` (all of them, newest first, when `text` is empty)."""
    store = memory_store()
    try:
        if text.strip():
            return store.search(text, k=k)
        recs = sorted(store.records(), key=lambda r: r.created, reverse=True)[:k]
        return [r.summary() for r in recs]
    except Exception as exc:  # chromadb missing or broken: MemoryUnavailable and friends
        raise Unavailable(f"memory search failed: {exc}") from exc


def history_state(record_id: str) -> dict:
    """A stored history in the graph-state shape (what the explainer and the renderer read)."""
    rec = memory_store().get(record_id)
    if rec is None:
        raise Unavailable(f"no stored optimization {record_id!r}")
    state = rec.as_state()
    state.setdefault("request", rec.request)
    return state


# -- explanations ---------------------------------------------------------------------------------
def explain(question: str, state: dict, llm=None) -> str:
    """The explainer's answer about a run (a graph state or a stored history's as_state())."""
    try:
        explainer = _optional("mtmc.agents.explainer", "explain")
    except Unavailable as exc:
        return f"The explainer is not available here ({exc})."
    try:
        store = memory_store()
    except Unavailable:
        store = None      # answers without similar past histories
    return explainer(question, state, store=store, llm=llm)


# -- module optimization -------------------------------------------------------------------------
def module_optimizer():
    """The module flow's entry point, or Unavailable."""
    return _optional("mtmc.agents.module_flow", "optimize_module")


# -- the optional LLM -----------------------------------------------------------------------------
def build_llm(base_url: str, model: str, api_key: str = ""):
    """An OpenAI-compatible chat model (mtmc.tools.llm.build), or None when no endpoint is set
    (offline); Unavailable when langchain-openai is missing."""
    from mtmc.tools.llm import LLMFailure, build
    try:
        return build(base_url, model, api_key)
    except LLMFailure as exc:
        raise Unavailable(str(exc)) from exc


def availability() -> dict[str, str]:
    """Which optional parts work here, in words, for the status panel."""
    parts = {}
    try:
        n = len(memory_store().records())
        parts["Memory"] = f"available ({n} past optimizations)"
    except Exception as exc:
        parts["Memory"] = f"not available ({exc})"
    for name, module, attr in (("Explainer", "mtmc.agents.explainer", "explain"),
                               ("Module optimization", "mtmc.agents.module_flow", "optimize_module")):
        try:
            _optional(module, attr)
            parts[name] = "available"
        except Unavailable:
            parts[name] = "not available in this build"
    return parts
