"""The event vocabulary: every progress event of a run, one dataclass per kind.

Nodes of the two graphs build these and send them as plain dicts (`to_dict()`: {"event": KIND,
...fields}), which is what LangGraph's custom stream, `on_event` callbacks and the tests see.
Whoever shows a run turns the dict back into its dataclass (`from_dict`) and renders that: the
command line through `events.text.lines`, the chat through ui.steps / ui.module_view.

A kernel run (agents.graph):  Parsed, Unsupported, Retrieved, then per step Code (a draft),
Verify (its verdict), Plan (the planner's next move or stop), Debug (a fix), StepDone (the
step's record), and Final.  A module run (agents.module_flow): Captured, Rewritten, Partitioned, per group
GroupStart, that group's kernel events (with `group` set), GroupDone; then GroupFallback,
ModuleCheck, ModuleTime, and Final; or Rejected.  Plain data only: this package imports nothing
of the project.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(kw_only=True)
class Event:
    kind: ClassVar[str] = "event"
    group: int | None = None          # the module's fusion group a kernel event belongs to
    more: dict = field(default_factory=dict)   # fields this vocabulary does not name (kept, passed on)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"event": self.kind}
        for f in dataclasses.fields(self):
            if f.name in ("group", "more"):
                continue
            out[f.name] = getattr(self, f.name)
        if self.group is not None:
            out["group"] = self.group
        out.update(self.more)
        return out

    def in_group(self, group: int) -> "Event":
        return dataclasses.replace(self, group=group)


# -- a kernel run ---------------------------------------------------------------------------

@dataclass(kw_only=True)
class Parsed(Event):
    kind: ClassVar[str] = "parsed"
    spec: dict
    description: str
    assumptions: list = field(default_factory=list)


@dataclass(kw_only=True)
class _Message(Event):
    """A run that ends here, with the reason in words."""
    message: str


@dataclass(kw_only=True)
class Unsupported(_Message):
    """A request the catalog cannot serve (or that cannot fit the GPU)."""
    kind: ClassVar[str] = "unsupported"


@dataclass(kw_only=True)
class Retrieved(Event):
    kind: ClassVar[str] = "retrieved"
    count: int = 0
    gpu: str | None = None
    note: str = ""
    histories: list = field(default_factory=list)   # id, description, final_config, stale, score


@dataclass(kw_only=True)
class _Decided(Event):
    """What a decision carries: the action, why, the alternatives weighed, who decided."""
    action: dict | None = None
    reason: str = ""
    alternatives: list = field(default_factory=list)   # action, prob, predicted_ms
    policy: str | None = None
    origin: str | None = None          # planner | debugger | template | given | memory
    history: dict | None = None        # the past runs it drew on


@dataclass(kw_only=True)
class Plan(_Decided):
    """The planner's decision after `step` steps: an action (kind "stop" ends the run)."""
    kind: ClassVar[str] = "plan"
    step: int
    predicted_ms: float | None = None


@dataclass(kw_only=True)
class Code(Event):
    """A new draft: its config and the diff from the draft it came from."""
    kind: ClassVar[str] = "code"
    step: int
    config: dict
    diff: str = ""
    origin: str | None = None          # template | given | memory | planner | debugger
    history: dict | None = None


@dataclass(kw_only=True)
class Verify(Event):
    kind: ClassVar[str] = "verify"
    step: int
    verdict: dict


@dataclass(kw_only=True)
class Debug(Event):
    kind: ClassVar[str] = "debug"
    step: int
    fix: str | None = None
    reason: str = ""


@dataclass(kw_only=True)
class StepDone(_Decided):
    """A finished step, as recorded for people and memory (state["steps"])."""
    kind: ClassVar[str] = "step"
    step: int
    outcome: str
    config: dict | None = None
    diff: str = ""
    verdict: dict | None = None
    time_ms: float | None = None


@dataclass(kw_only=True)
class Final(Event):
    """The end of a kernel run or of a module run: the answer in words."""
    kind: ClassVar[str] = "final"
    status: str
    message: str
    artifact: str | None = None
    history_id: str | None = None


# -- a module run ---------------------------------------------------------------------------

@dataclass(kw_only=True)
class Rejected(_Message):
    """An upload that cannot be optimized (bad file, capture failed, too big)."""
    kind: ClassVar[str] = "rejected"


@dataclass(kw_only=True)
class Captured(Event):
    kind: ClassVar[str] = "captured"
    graphs: list = field(default_factory=list)
    problems: list = field(default_factory=list)     # path, reason, where


@dataclass(kw_only=True)
class Rewritten(Event):
    """The graph stage's algebraic rewrites (module.graph_stage): applied ones and refused ones,
    each rule, node, ops, result, reason and predicted_gain_ms."""
    kind: ClassVar[str] = "rewritten"
    applied: list = field(default_factory=list)
    refused: list = field(default_factory=list)


@dataclass(kw_only=True)
class Partitioned(Event):
    kind: ClassVar[str] = "partitioned"
    groups: list = field(default_factory=list)       # id, ops, family
    torch_ops: list = field(default_factory=list)    # op, why


@dataclass(kw_only=True)
class GroupStart(Event):
    kind: ClassVar[str] = "group_start"
    group: int
    ops: list = field(default_factory=list)
    description: str = ""


@dataclass(kw_only=True)
class GroupDone(Event):
    kind: ClassVar[str] = "group_done"
    group: int
    status: str
    reason: str = ""


@dataclass(kw_only=True)
class GroupFallback(Event):
    kind: ClassVar[str] = "group_fallback"
    group: int
    reason: str = ""


@dataclass(kw_only=True)
class ModuleCheck(Event):
    kind: ClassVar[str] = "module_check"
    status: str
    reason: str = ""
    phases: list = field(default_factory=list)   # the guard's [job kind, seconds]


@dataclass(kw_only=True)
class ModuleTime(Event):
    kind: ClassVar[str] = "module_time"
    measured: bool | None = None
    ours_ms: float | None = None
    eager_ms: float | None = None
    compiled_ms: float | None = None


@dataclass(kw_only=True)
class Replayed(Event):
    """The launch-overhead action's decision (module.graph_replay)."""
    kind: ClassVar[str] = "replay"
    status: str
    why: str = ""
    plain_ms: float | None = None
    replay_ms: float | None = None


KINDS: dict[str, type[Event]] = {c.kind: c for c in (
    Parsed, Unsupported, Retrieved, Plan, Code, Verify, Debug, StepDone, Final,
    Rejected, Captured, Rewritten, Partitioned, GroupStart, GroupDone, GroupFallback, ModuleCheck, ModuleTime,
    Replayed)}


def from_dict(data: dict | Event) -> Event:
    """The event a dict carries (an Event is returned as it is); an unknown kind is a bare Event
    with everything in `more`."""
    if isinstance(data, Event):
        return data
    cls = KINDS.get(data.get("event"), Event)
    names = {f.name for f in dataclasses.fields(cls)} - {"more"}
    known = {k: v for k, v in data.items() if k in names}
    more = {k: v for k, v in data.items() if k not in names and k != "event"}
    if cls is Event:
        more["event"] = data.get("event")
    try:
        return cls(**known, more=more)
    except TypeError:        # a required field missing: keep what came, unrendered
        return Event(group=data.get("group"), more={k: v for k, v in data.items()})


def build(kind: str, **data) -> Event:
    """The event of `kind` from keyword fields (unknown ones go to `more`)."""
    return from_dict({"event": kind, **data})
