"""The run as chat messages: one collapsible bubble per step (Gradio "thoughts": metadata with a
title and a pending / done status), built from the graph's events as they arrive, or from the
step records a finished run left in the checkpointer (history)."""
from __future__ import annotations

import time

from mtmc.agents import events as E
from mtmc.agents.events.text import guard_line, resources_line, timing_line
from mtmc.policy.actions import Action
from mtmc.ui.plots import time_table
from mtmc.ui.text import plain

ORIGIN_WORDS = {"template": "first draft (template)", "given": "first draft (given config)",
                "memory": "first draft (from memory)",
                "planner": "planner", "debugger": "debugger"}


def action_label(action: dict | None) -> str:
    return Action.from_dict(action).label() if action and action.get("kind") not in (None, "init") else ""


def step_title(rec: dict) -> str:
    origin = ORIGIN_WORDS.get(rec.get("origin") or "", rec.get("origin") or "step")
    label = action_label(rec.get("action"))
    return f"Step {rec['step']} · {origin}" + (f": {label}" if label else "")


def short_verdict(verdict: dict | None) -> str:
    if not verdict:
        return "compiling and checking..."
    if not verdict.get("ok"):
        return f"failed: {verdict.get('kind')}"
    t = verdict.get("time_ms")
    kind = "measured" if verdict.get("measured") else "estimate"
    return "correct" + (f", {t:.4f} ms ({kind})" if isinstance(t, (int, float)) else "")


def decision_md(decision: dict) -> str:
    who = "Debugger" if decision.get("origin") == "debugger" else "Planner"
    lines = [f"**{who}:** {decision.get('reason', '')}"]
    alts = decision.get("alternatives") or []
    if alts:
        lines += ["", "| alternative | probability | predicted time |", "|---|---|---|"]
        for a in alts:
            ms = a.get("predicted_ms")
            lines.append(f"| `{a['action']}` | {a['prob']:.2f} | "
                         + (f"{ms:.4f} ms |" if isinstance(ms, (int, float)) else "- |"))
    if decision.get("policy"):
        lines += ["", f"_policy: {decision['policy']}_"]
    return "\n".join(lines)


def verdict_md(verdict: dict, baselines: dict | None) -> str:
    res = resources_line(verdict.get("resources"))
    target = (verdict.get("resources") or {}).get("target", "the target")
    compile_line = f"- Compile for {target}: {res}" if res else ""
    if not verdict.get("ok"):
        lines = [f"**Verdict:** failed at {verdict.get('stage')}: `{verdict.get('kind')}`",
                 f"- {plain(str(verdict.get('detail', ''))[:600])}", compile_line]
        return "\n".join(l for l in lines if l)
    corr = verdict.get("correctness") or {}
    err = corr.get("max_rel_err")
    check = (f"- Against PyTorch: {corr.get('reason', 'checked')}"
             + (f"; largest error {err:.2g} of the tolerance" if isinstance(err, (int, float)) else "")
             + f" (on {corr.get('device')}, dims {corr.get('dims')})")
    time_txt = timing_line(verdict, baselines).removeprefix("time: ")
    guard = guard_line(verdict.get("guard"))
    guard_txt = f"- The guard of `mtmc verify`: {guard.removeprefix('guard: ')}" if guard else ""
    return "\n".join(l for l in ["**Verdict:** correct", check, compile_line, guard_txt, f"- Time: {time_txt}"] if l)


def step_body(rec: dict, baselines: dict | None = None) -> str:
    parts = []
    if rec.get("reason"):
        parts.append(decision_md(rec))
    if rec.get("config") is not None:
        parts.append(f"**Config:** `{rec['config']}`")
    if rec.get("diff"):
        parts.append(f"```diff\n{rec['diff']}\n```")
    if rec.get("verdict"):
        parts.append(verdict_md(rec["verdict"], baselines))
    if rec.get("fix_note"):
        parts.append(rec["fix_note"])
    if rec.get("outcome"):
        parts.append(f"**Outcome:** {rec['outcome']}")
    return "\n\n".join(parts)


def step_message(rec: dict, status: str, baselines: dict | None = None, prefix: str = "",
                 duration: float | None = None) -> dict:
    meta = {"title": step_title(rec), "status": status, "id": f"{prefix}step-{rec['step']}",
            "log": short_verdict(rec.get("verdict"))}
    if prefix:
        meta["parent_id"] = prefix.rstrip("/")
    if duration is not None:
        meta["duration"] = round(duration, 1)
    return {"role": "assistant", "content": step_body(rec, baselines), "metadata": meta}


def stop_message(decision: dict, prefix: str = "") -> dict:
    meta = {"title": "Planner: stop", "status": "done", "id": f"{prefix}stop"}
    if prefix:
        meta["parent_id"] = prefix.rstrip("/")
    return {"role": "assistant", "content": decision_md(decision), "metadata": meta}


def intake_text(description: str, assumptions: list[str], retrieved: int | None) -> str:
    lines = [f"**Understood:** {description}"]
    lines += [f"- assumed: {a}" for a in assumptions]
    if retrieved is not None:
        lines.append(f"- similar past optimizations retrieved from memory: {retrieved}")
    return "\n".join(lines)


def final_text(message: str) -> str:
    head, _, rest = message.partition("\n")
    return f"**{plain(head)}**\n" + "\n".join(f"- {plain(line)}" for line in rest.splitlines() if line.strip())


def suggested_questions(steps: list[int], stopped: bool) -> list[str]:
    """Why-questions this run's records can answer: its last step, and its stop when the
    planner stopped on its own (offline runs often stop at step 0, so never a step it lacks)."""
    return ([f"why step {steps[-1]}?"] if steps else []) + (["why did you stop?"] if stopped else [])


def suggestion_line(questions: list[str]) -> str:
    return "Ask " + " or ".join(f"*{q}*" for q in questions) + " to see the reasons." if questions else ""


class StepStream:
    """Feed it the graph's events in order; `messages` is the chat so far (rebuilt in place),
    `records` the finished steps, `final` the final event."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix                     # "group-2/" nests bubbles under a group
        self.messages: list[dict] = []
        self.records: list[dict] = []
        self.final: dict | None = None
        self.spec: dict | None = None
        self.baselines: dict = {}
        self._open: dict[int, dict] = {}          # step -> its partial record
        self._index: dict[int, int] = {}          # step -> position in messages
        self._started: dict[int, float] = {}
        self._decision: dict | None = None        # the next code event's decision
        self._intake: int | None = None
        self._understood: tuple[str, list[str]] = ("", [])
        self.stopped = False                      # the planner stopped on its own

    def feed(self, ev: E.Event | dict) -> None:
        """One event of the run (an mtmc.agents.events dataclass, or the dict it travels as)."""
        ev = E.from_dict(ev)
        handler = getattr(self, f"_on_{ev.kind}", None)
        if handler:
            handler(ev)

    # -- events -------------------------------------------------------------------------
    def _on_parsed(self, ev: E.Parsed):
        self.spec = ev.spec
        self._understood = (ev.description, list(ev.assumptions or []))
        self._intake = len(self.messages)
        self.messages.append(self._assistant(intake_text(*self._understood, None), "Understood"))

    def _on_retrieved(self, ev: E.Retrieved):
        if self._intake is not None:
            self.messages[self._intake]["content"] = intake_text(*self._understood, ev.count)

    def _on_unsupported(self, ev: E.Unsupported):
        self.messages.append(self._assistant(plain(ev.message), "Not supported"))

    def _on_plan(self, ev: E.Plan):
        decision = {k: v for k, v in ev.to_dict().items() if k not in ("event", "step", "group")}
        if (ev.action or {}).get("kind") == "stop":
            self.stopped = True
            self.messages.append(stop_message(decision, self.prefix))
        else:
            self._decision = decision

    def _on_debug(self, ev: E.Debug):
        rec = self._open.get(ev.step) or next((r for r in reversed(self.records) if r["step"] == ev.step), None)
        note = f"**Debugger:** {ev.fix or 'no fix'}: {ev.reason}"
        if rec is not None:
            rec["fix_note"] = note
            self._render(rec, "pending" if ev.step in self._open else "done")
        if ev.fix:
            self._decision = {"origin": "debugger", "reason": ev.reason, "action": None, "fix": ev.fix}

    def _on_code(self, ev: E.Code):
        step = ev.step
        decision = self._decision or {}
        self._decision = None
        rec = {"step": step, "origin": ev.origin, "config": ev.config, "diff": ev.diff or "",
               "reason": decision.get("reason", ""), "alternatives": decision.get("alternatives", []),
               "policy": decision.get("policy"), "action": decision.get("action")}
        if decision.get("fix") and not rec["action"]:
            rec["action_label"] = decision["fix"]
        self._open[step] = rec
        self._started[step] = time.monotonic()
        self._index[step] = len(self.messages)
        self.messages.append({})
        self._render(rec, "pending")

    def _on_verify(self, ev: E.Verify):
        rec = self._open.get(ev.step)
        if rec is not None:
            rec["verdict"] = ev.verdict
            if ev.verdict.get("baselines"):
                self.baselines = ev.verdict["baselines"]
            self._render(rec, "pending")

    def _on_step(self, ev: E.StepDone):
        # the record's fields that the event carries win over what the open bubble gathered
        given = {k: v for k, v in ev.to_dict().items() if k not in ("event", "group") and v not in (None, "", [], {})}
        rec = {**self._open.pop(ev.step, {}), **given}
        if ev.step not in self._index:     # a step we did not see begin (should not happen)
            self._index[ev.step] = len(self.messages)
            self.messages.append({})
        self.records.append(rec)
        self._render(rec, "done")

    def _on_final(self, ev: E.Final):
        self.final = ev.to_dict()
        text = final_text(ev.message)
        if ev.status == "done" and not self.prefix:   # a module's groups are asked about by group
            text += "\n\n" + suggestion_line(suggested_questions([r["step"] for r in self.records], self.stopped))
        self.messages.append(self._assistant(text.rstrip(), "Result"))

    def phase(self) -> str:
        """What the run is doing now, in words (for a run that has been quiet for a while)."""
        if self.final is not None:
            return "writing the answer"
        if self._open:
            step = max(self._open)
            return (f"verifying step {step}: compiling it for the target GPU and checking it against "
                    "PyTorch in a sandboxed child (and timing it, on a GPU)")
        if self.records:
            return f"the planner is choosing the move after step {self.records[-1]['step']}"
        if self.spec is not None:
            return "looking up similar past runs and writing the first draft"
        return "reading the request"

    def time_table(self):
        return time_table(self.records, self.baselines)

    # -- helpers --------------------------------------------------------------------------
    def _render(self, rec: dict, status: str):
        started = self._started.get(rec["step"])
        duration = time.monotonic() - started if started is not None and status == "done" else None
        msg = step_message(rec, status, self.baselines, self.prefix, duration)
        if rec.get("action_label") and not action_label(rec.get("action")):
            msg["metadata"]["title"] += f": {rec['action_label']}"
        self.messages[self._index[rec["step"]]] = msg

    def _assistant(self, text: str, title: str) -> dict:
        """A plain message; nested under a group (a titled thought) when the stream has a prefix."""
        msg = {"role": "assistant", "content": text}
        if self.prefix:
            msg["metadata"] = {"title": title, "parent_id": self.prefix.rstrip("/"), "status": "done"}
        return msg


def messages_from_state(state: dict) -> list[dict]:
    """A finished run (a checkpointed state) as chat messages, for the history tab."""
    msgs = [{"role": "user", "content": state.get("request", "")}]
    spec = state.get("spec")
    if spec:
        from mtmc.kernels.catalog import describe
        from mtmc.kernels.spec import KernelSpec
        msgs.append({"role": "assistant", "content": intake_text(describe(KernelSpec.from_dict(spec)),
                                                                 state.get("assumptions") or [],
                                                                 len(state.get("retrieved") or []))})
    for rec in state.get("steps") or []:
        msgs.append(step_message(rec, "done", state.get("baselines")))
    if state.get("message"):
        msgs.append({"role": "assistant", "content": final_text(state["message"])})
    return msgs
