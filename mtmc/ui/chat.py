"""The chat's turn logic, free of Gradio: one message in, a stream of updates out.

An update is a dict keyed by what it changes: chat (the messages), thread (the conversation's
checkpointer thread id), box (the input), code, download, times, roofline, report.  The
layout maps the keys to components; tests can drive this directly.

One turn at a time per conversation: a message sent while a turn runs is shown at once under it,
marked queued, and answered when the turn ends (by the running turn's stream, so the chat never
shows two versions of the conversation).  A run that has been quiet for a while says what it is
doing and for how long.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from mtmc.agents.context import Context
from mtmc.ui.followup import FollowUp, interpret
from mtmc.agents.runner import run_request
from mtmc.tools.paths import artifacts_dir
from mtmc.tools.hardware import present_gpu, resolve
from mtmc.ui import conversation, services
from mtmc.ui.module_view import ModuleStream, fusion_answer, report_html, report_table, roofline_points
from mtmc.ui.plots import kernel_point, roofline_svg, time_svg
from mtmc.ui.runqueue import RunQueue, run_in_line
from mtmc.ui.settings import Settings
from mtmc.ui.steps import StepStream
from mtmc.ui.text import plain
from mtmc.ui.upload import UploadError, check_module

EMPTY_BOX = {"text": "", "files": []}
KEEP_CONVERSATIONS = 1024      # conversations whose latest messages the server remembers


def say(text: str, title: str | None = None) -> dict:
    msg = {"role": "assistant", "content": text}
    if title:
        msg["metadata"] = {"title": title}
    return msg


@dataclass
class _Running:
    """A conversation whose turn is running: its messages, and what was sent meanwhile."""
    history: list
    queued: list = field(default_factory=list)     # (the user's message, the notice under it, message, settings)

    def notes(self) -> list[dict]:
        return [m for entry, notice, _, _ in self.queued for m in (entry, notice)]


class Chat:
    """Shared by every session of one app: the run line, and which conversations are running.
    tick_s: how often a running job is looked at; quiet_s: how long it may stay silent before the
    chat says what it is doing."""

    def __init__(self, line: RunQueue | None = None, tick_s: float = 1.0, quiet_s: float = 3.0):
        self.line = line or RunQueue()
        self.tick_s, self.quiet_s = tick_s, quiet_s
        self._running: dict[str, _Running] = {}
        self._shown: OrderedDict[str, list] = OrderedDict()   # thread -> the messages last sent to it
        self._lock = threading.Lock()

    # -- one message ----------------------------------------------------------------------------
    def respond(self, message: dict | None, history: list | None, thread_id: str | None,
                settings: dict | None) -> Iterator[dict]:
        message = message or {}
        if not conversation.valid_thread(thread_id):
            thread_id = uuid.uuid4().hex
        with self._lock:   # the server's copy wins: a page may send a message before the last answer reached it
            history = list(self._shown.get(thread_id) or history or [])
        entry = _user_entry(message)
        if entry is None:
            yield {"chat": history, "thread": thread_id}
            return
        with self._lock:
            running = self._running.get(thread_id)
            busy = running is not None
            if busy:      # a turn is running here: queue this message, visibly
                running.queued.append((entry, say(_queued_text(len(running.queued) + 1), title="Queued"),
                                       message, settings))
                shown = running.history + running.notes()
            else:
                running = self._running[thread_id] = _Running(history)
        if busy:
            yield {"chat": shown, "thread": thread_id, "box": EMPTY_BOX}
            return
        try:
            turn = (entry, message, settings, True)
            while turn:
                for update in self._turn(*turn, history, thread_id):
                    if "chat" in update:
                        with self._lock:
                            update["chat"] = update["chat"] + running.notes()
                            self._remember(thread_id, update["chat"])
                    yield update
                with self._lock:      # the next queued message, or the conversation is free again
                    if running.queued:
                        entry, _, message, settings = running.queued.pop(0)
                        turn = (entry, message, settings, False)
                    else:
                        del self._running[thread_id]
                        turn = None
        finally:
            with self._lock:
                if self._running.get(thread_id) is running:
                    del self._running[thread_id]

    def _remember(self, thread_id: str, messages: list) -> None:
        self._shown[thread_id] = messages
        self._shown.move_to_end(thread_id)
        while len(self._shown) > KEEP_CONVERSATIONS:
            self._shown.popitem(last=False)

    # -- one turn -----------------------------------------------------------------------------
    def _turn(self, entry: dict, message: dict, settings: dict | None, first: bool, history: list,
              thread_id: str) -> Iterator[dict]:
        text, upload = _parts(message)
        prefs = Settings.from_dict(settings)
        history.append(entry)
        yield {"chat": history, "thread": thread_id, "box": EMPTY_BOX} if first else {"chat": history}
        if upload:
            yield from self._module(upload, history, thread_id, prefs)
            return
        last = conversation.last_run(thread_id)
        prior = services.thread_state(thread_id) if last.get("kind") == "kernel" else {}
        follow = interpret(text, prior.get("spec") if prior.get("steps") else None, prior.get("alternative"),
                           ran=bool(last.get("kind")))
        if follow.kind == "why":
            history.append(say(self._why(text, follow, last, prior, prefs)))
            yield {"chat": history}
        elif follow.kind == "unclear":
            history.append(say(f"I could not apply that to the last kernel: {follow.message}"))
            yield {"chat": history}
        else:
            if follow.kind in ("change", "reading"):
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
            history.append(say(plain(str(exc)) if isinstance(exc, UploadError)
                               else f"Module optimization is not available in this build ({plain(str(exc))})."))
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
        update = {"chat": history, "times": time_svg(stream.time_table()), "report": report_html(report_table(summary)),
                  "roofline": roofline_svg(roofline_points(summary, profile), profile)}
        if out.exists():
            update.update(code=out.read_text(), download=str(out))
        yield update

    def _run(self, job, stream, history: list, thread_id: str) -> Iterator[dict]:
        """Stream `job` into the chat; returns its result (None if it failed or could not start).
        While the job is quiet for quiet_s or more, the last message says what it is doing and
        for how long."""
        base = len(history)
        quiet_since = time.monotonic()
        for kind, item in run_in_line(self.line, job, tick_s=self.tick_s):
            if kind == "tick":
                quiet = time.monotonic() - quiet_since
                if quiet < self.quiet_s:
                    continue
                history[base:] = stream.messages + [say(working_text(stream.phase(), quiet, item), title="Working")]
            elif kind == "wait":
                history[base:] = [say(waiting_text(item), title="In the queue")]
            elif kind == "event":
                quiet_since = time.monotonic()
                stream.feed(item)
                history[base:] = stream.messages
            elif kind == "error":
                history[base:] = stream.messages + [say(f"The run stopped with an error: {plain(str(item))}")]
                yield {"chat": history}
                return None
            else:
                history[base:] = stream.messages
                yield {"chat": history}
                return item
            update = {"chat": history}
            if kind == "event" and item.get("event") == "step":
                update["times"] = time_svg(stream.time_table())
            yield update
        return None


def waiting_text(ahead: int) -> str:
    """A place in the run line, and what the line is for on this machine."""
    runs = f"{ahead} run{'s' if ahead > 1 else ''} ahead of you"
    if present_gpu() is not None:
        return f"Waiting for the GPU: {runs} (one runs at a time)."
    return (f"Waiting for your turn: {runs}. This machine has no GPU, so runs check their kernels in "
            "Triton's interpreter on the CPU, one at a time.")


def working_text(phase: str, quiet_s: float, elapsed_s: float) -> str:
    return (f"Still working ({quiet_s:.0f} s on this so far, {elapsed_s:.0f} s since the run started): "
            f"{phase}.")


def _queued_text(position: int) -> str:
    return (f"A run is in progress in this conversation: this message is queued ({position} waiting) and "
            "is answered as soon as the run ends.")


def _parts(message: dict) -> tuple[str, str | None]:
    """(the text, the uploaded file's path or None) of a message from the box."""
    files = [f for f in message.get("files") or [] if f]
    return (message.get("text") or "").strip(), _file_path(files[0]) if files else None


def _user_entry(message: dict) -> dict | None:
    """The user's message as the chat shows it; None for an empty one."""
    text, upload = _parts(message)
    if upload:
        return {"role": "user", "content": f"Uploaded module `{Path(upload).name}`" + (f": {text}" if text else "")}
    return {"role": "user", "content": text} if text else None


def _kernel_outputs(state: dict, stream: StepStream, prefs: Settings) -> dict:
    best = state.get("best") or {}
    verdict = best.get("verdict") or {}
    artifact = state.get("artifact")
    out = {"times": time_svg(stream.time_table())}
    if artifact and Path(artifact).exists():
        out.update(code=Path(artifact).read_text(), download=artifact)
    if isinstance(best.get("time_ms"), (int, float)) and state.get("spec"):   # a custom op has no roofline spec
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
    return Context(target=prefs.target, max_steps=prefs.max_steps, llm=_llm(prefs), allow_tf32=prefs.allow_tf32)


def _file_path(f) -> str:
    """Gradio hands files over as paths or as {"path": ...} dicts, depending on the caller."""
    return f.get("path") if isinstance(f, dict) else str(f)
