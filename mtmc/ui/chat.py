"""The chat's turn logic, free of Gradio: one message in, a stream of updates out.

An update is a dict keyed by what it changes: chat (the messages), thread (the conversation's
checkpointer thread id), box (the input), code, download, times, roofline, report.  The
layout maps the keys to components; tests can drive this directly.
"""
from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Iterator

from mtmc.agents.context import Context
from mtmc.agents.followup import FollowUp, interpret
from mtmc.agents.runner import run_request
from mtmc.paths import artifacts_dir
from mtmc.tools.hardware import resolve
from mtmc.ui import conversation, services
from mtmc.ui.module_view import ModuleStream, fusion_answer, report_table, roofline_points
from mtmc.ui.plots import kernel_point, roofline_svg
from mtmc.ui.runqueue import RunQueue, run_in_line
from mtmc.ui.settings import Settings
from mtmc.ui.steps import StepStream
from mtmc.ui.upload import UploadError, check_module

EMPTY_BOX = {"text": "", "files": []}


def say(text: str, title: str | None = None) -> dict:
    msg = {"role": "assistant", "content": text}
    if title:
        msg["metadata"] = {"title": title}
    return msg


class Chat:
    """Shared by every session of one app: the run line, and which conversations are running."""

    def __init__(self, line: RunQueue | None = None):
        self.line = line or RunQueue()
        self._busy: set[str] = set()
        self._lock = threading.Lock()

    # -- one turn -----------------------------------------------------------------------------
    def respond(self, message: dict | None, history: list | None, thread_id: str | None,
                settings: dict | None) -> Iterator[dict]:
        message = message or {}
        text = (message.get("text") or "").strip()
        files = [f for f in message.get("files") or [] if f]
        history = list(history or [])
        if not conversation.valid_thread(thread_id):
            thread_id = uuid.uuid4().hex
        prefs = Settings.from_dict(settings)
        if not text and not files:
            yield {"chat": history, "thread": thread_id}
            return
        upload = _file_path(files[0]) if files else None
        history.append({"role": "user", "content": f"Uploaded module `{Path(upload).name}`" + (f": {text}" if text else "")
                        if upload else text})
        yield {"chat": history, "thread": thread_id, "box": EMPTY_BOX}
        if upload:
            yield from self._module(upload, history, thread_id, prefs)
            return
        last = conversation.last_run(thread_id)
        prior = services.thread_state(thread_id) if last.get("kind") == "kernel" else {}
        follow = interpret(text, prior.get("spec") if prior.get("steps") else None)
        if follow.kind == "why":
            history.append(say(self._why(text, follow, last, prior, prefs)))
            yield {"chat": history}
        elif follow.kind == "unclear":
            history.append(say(f"I could not apply that to the last kernel: {follow.message}"))
            yield {"chat": history}
        else:
            if follow.kind == "change":
                history.append(say("Follow-up on the last kernel: " + "; ".join(follow.changes) + "."))
            yield from self._kernel(text, follow.spec, history, thread_id, prefs)

    # -- why ----------------------------------------------------------------------------------
    def _why(self, question: str, follow: FollowUp, last: dict, prior: dict, prefs: Settings) -> str:
        if last.get("kind") == "module":
            return self._module_why(question, follow, last, prefs)
        if not prior.get("steps"):
            return "There is nothing to explain yet in this conversation: ask for a kernel first."
        return services.explain(question, prior, llm=_llm(prefs))

    def _module_why(self, question: str, follow: FollowUp, note: dict, prefs: Settings) -> str:
        """Fusion questions from the module's split; step questions from a group's history."""
        summary, histories = note["summary"], note.get("histories") or {}
        if follow.fusion and follow.step is None:
            return fusion_answer(question, summary)
        if not histories:
            return "No fusion group of the last module got a kernel, so there are no steps to explain.\n\n" \
                   + fusion_answer(question, summary)
        group = str(follow.group) if follow.group is not None else None
        if group is not None and group not in histories:
            return f"Group {group} has no recorded steps; the groups with steps are {', '.join(histories)}."
        lead = "" if group is not None else f"(No group named; answering for group {next(iter(histories))}.)\n"
        group = group if group is not None else next(iter(histories))
        try:
            state = services.history_state(histories[group])
        except services.Unavailable as exc:
            return f"The history of group {group} cannot be read: {exc}"
        return f"{lead}**Group {group}**\n\n" + services.explain(question, state, llm=_llm(prefs))

    # -- runs ---------------------------------------------------------------------------------
    def _kernel(self, text: str, spec: dict | None, history: list, thread_id: str, prefs: Settings) -> Iterator[dict]:
        ctx, stream = _context(prefs), StepStream()

        def job(on_event):
            return run_request(text, ctx, thread_id=thread_id, on_event=on_event, spec=spec)

        state = yield from self._run(job, stream, history, thread_id)
        if state is None:
            return
        conversation.note_kernel_run(thread_id)
        if state.get("status") == "done":
            yield {"chat": history, **_kernel_outputs(state, stream, prefs)}

    def _module(self, upload: str, history: list, thread_id: str, prefs: Settings) -> Iterator[dict]:
        try:
            path = check_module(upload)
            optimize = services.module_optimizer()
        except (UploadError, services.Unavailable) as exc:
            history.append(say(str(exc) if isinstance(exc, UploadError)
                               else f"Module optimization is not available in this build ({exc})."))
            yield {"chat": history}
            return
        ctx, stream = _context(prefs), ModuleStream()
        out = artifacts_dir() / "modules" / path.parent.name / f"{path.stem}_new.py"   # one folder per upload

        def job(on_event):
            return optimize(str(path), ctx, str(out), str(out.with_name(f"{path.stem}_report.md")), on_event=on_event)

        summary = yield from self._run(job, stream, history, thread_id)
        if summary is None or summary.get("status") == "rejected":
            return
        conversation.note_module_run(thread_id, summary, stream.histories)
        history.append(say(summary.get("report", ""), title="Report"))
        profile = resolve(prefs.target)
        update = {"chat": history, "times": stream.time_table(), "report": report_table(summary),
                  "roofline": roofline_svg(roofline_points(summary, profile), profile)}
        if out.exists():
            update.update(code=out.read_text(), download=str(out))
        yield update

    def _run(self, job, stream, history: list, thread_id: str) -> Iterator[dict]:
        """Stream `job` into the chat; returns its result (None if it failed or could not start)."""
        with self._lock:
            if thread_id in self._busy:
                history.append(say("This conversation is still running; wait for it to finish, "
                                   "or start a new conversation."))
                yield {"chat": history}
                return None
            self._busy.add(thread_id)
        base = len(history)
        try:
            for kind, item in run_in_line(self.line, job):
                if kind == "wait":
                    history[base:] = [say(f"Waiting for the GPU: {item} run{'s' if item > 1 else ''} ahead "
                                          f"of you (one runs at a time).", title="In the queue")]
                elif kind == "event":
                    stream.feed(item)
                    history[base:] = stream.messages
                elif kind == "error":
                    history[base:] = stream.messages + [say(f"The run stopped with an error: {item}")]
                    yield {"chat": history}
                    return None
                else:
                    history[base:] = stream.messages
                    yield {"chat": history}
                    return item
                update = {"chat": history}
                if kind == "event" and item.get("event") == "step":
                    update["times"] = stream.time_table()
                yield update
        finally:
            with self._lock:
                self._busy.discard(thread_id)
        return None


def _kernel_outputs(state: dict, stream: StepStream, prefs: Settings) -> dict:
    best = state.get("best") or {}
    verdict = best.get("verdict") or {}
    artifact = state.get("artifact")
    out = {"times": stream.time_table()}
    if artifact and Path(artifact).exists():
        out.update(code=Path(artifact).read_text(), download=artifact)
    if isinstance(best.get("time_ms"), (int, float)):
        profile = resolve(prefs.target)
        point = kernel_point(state["spec"], best["time_ms"], profile, bool(verdict.get("measured")),
                             name=f"final kernel (step {best.get('step')})")
        out["roofline"] = roofline_svg([point], profile)
    return out


def _llm(prefs: Settings):
    try:
        return services.build_llm(prefs.llm_base_url, prefs.llm_model, prefs.llm_api_key)
    except services.Unavailable:
        return None


def _context(prefs: Settings) -> Context:
    return Context(target=prefs.target, max_steps=prefs.max_steps, llm=_llm(prefs))


def _file_path(f) -> str:
    """Gradio hands files over as paths or as {"path": ...} dicts, depending on the caller."""
    return f.get("path") if isinstance(f, dict) else str(f)
