"""The graph's state: plain JSON-able data, so the checkpointer can keep every thread."""
from __future__ import annotations

from typing import TypedDict


class Draft(TypedDict, total=False):
    """One version of the kernel: the config the macro actions turn, and its rendered source."""
    config: dict
    source: str
    step: int              # the step that produced it (0: the template's first draft)
    diff: str              # unified diff against the draft it was derived from
    verdict: dict          # the verifier's verdict, once verified
    time_ms: float         # measured (GPU) or estimated time of this draft


class State(TypedDict, total=False):
    request: str                       # the words, or a description of the module group
    spec: dict | None                  # KernelSpec.to_dict()
    status: str                        # running | unsupported | done | failed
    message: str                       # the final answer in words
    assumptions: list[str]
    retrieved: list[dict]              # similar past histories from memory
    initial_config: dict | None        # a config to start from (memory warm start, tests)
    best: Draft                        # the last good draft (what a roll-back returns to)
    candidate: Draft                   # the draft under verification
    decision: dict                     # the planner's pending decision
    # Plain lists, replaced whole by the node that extends them: a new request in the same thread
    # (a follow-up in the chat) starts them afresh.
    steps: list[dict]                  # every step, as recorded for people and memory
    tried: list[str]                   # config keys already verified
    debug_attempts: int
    stale_steps: int                   # measured moves in a row that did not beat `best`
    baselines: dict                    # eager / torch.compile times, measured once per run
    artifact: str                      # path of the written kernel file
    history_id: str | None             # this run's history in memory (never its own "similar past run")
    custom: dict | None                # an op outside the catalog: the model's reference (agents.custom_op)
    alternative: dict                  # the request's other reading (the rules' beside the model's), a spec
    llm_calls: list[dict]              # the chat model's calls: role, latency_s, tokens, error (tools.llm.ask)
