"""A module optimization as chat messages: what was captured and how it was split, then one
collapsible bubble per fusion group holding that group's step bubbles (the same StepStream as a
single kernel, nested), then the whole-module check and the report; plus the report table and
the pictures for the side panel."""
from __future__ import annotations

from html import escape

import pandas as pd

from mtmc.agents import events as E
from mtmc.agents.events.text import UNCAPTURED
from mtmc.module.report import replay_answer, rewrite_answer
from mtmc.tools.hardware import HardwareProfile
from mtmc.ui.plots import kernel_point, time_table
from mtmc.ui.steps import StepStream, final_text
from mtmc.ui.text import plain

REPORT_COLUMNS = ["group", "ops", "result", "correctness", "time after (ms)", "timing"]
REPORT_PLACEHOLDER = "<p>The module report appears after an upload.</p>"


def say(text: str, title: str | None = None) -> dict:
    msg = {"role": "assistant", "content": text}
    if title:
        msg["metadata"] = {"title": title, "status": "done"}
    return msg


class ModuleStream:
    """Feed it the module flow's events; `messages` is the chat so far."""

    def __init__(self):
        self._blocks: list = []                       # message dicts, or group ids (their bubbles)
        self.groups: dict[int, StepStream] = {}
        self._heads: dict[int, dict] = {}             # group id -> its parent bubble
        self.histories: dict[int, str] = {}           # group id -> its history in memory
        self.final: dict | None = None

    @property
    def messages(self) -> list[dict]:
        out = []
        for block in self._blocks:
            if isinstance(block, int):
                out.append(self._heads[block])
                out += self.groups[block].messages
            else:
                out.append(block)
        return out

    def feed(self, ev: E.Event | dict) -> None:
        """One event of the module run (an mtmc.agents.events dataclass, or the dict it travels as)."""
        ev = E.from_dict(ev)
        gid = ev.group
        if isinstance(ev, E.GroupStart):
            self._heads[gid] = {"role": "assistant", "content": "Ops: " + " -> ".join(ev.ops or []),
                                "metadata": {"title": f"Group {gid}: {ev.description}",
                                             "id": f"group-{gid}", "status": "pending"}}
            self.groups[gid] = StepStream(prefix=f"group-{gid}/")
            self._blocks.append(gid)
        elif isinstance(ev, (E.GroupDone, E.GroupFallback)) and gid in self._heads:
            status = ev.status if isinstance(ev, E.GroupDone) else None
            head = self._heads[gid]
            head["metadata"].update(status="done", log=status or "falls back to PyTorch")
            head["content"] += f"\n\n**{status or 'fallback'}:** {ev.reason}"
        elif gid is not None and gid in self.groups:
            if isinstance(ev, E.Final) and ev.history_id:
                self.histories[gid] = ev.history_id
            self.groups[gid].feed(ev)
        elif isinstance(ev, E.Captured):
            problems = [f"- could not capture {p.get('path') or 'Model.forward'}: {p.get('reason')}{UNCAPTURED}"
                        for p in ev.problems or []]
            self._blocks.append(say("\n".join([f"**Captured** {len(ev.graphs or [])} graph(s) "
                                               "in a sandboxed child process.", *problems])))
        elif isinstance(ev, E.Rewritten):
            if ev.applied or ev.refused:
                lines = [f"**Graph stage:** {len(ev.applied or [])} algebraic rewrite(s) applied"]
                lines += [f"- {r['rule']}: {' -> '.join(r['ops'])} becomes {r['result']}: {plain(r['reason'])}"
                          for r in ev.applied or []]
                lines += [f"- not rewritten ({r['rule']}): {' -> '.join(r['ops'])}: {plain(r['reason'])}"
                          for r in ev.refused or []]
                self._blocks.append(say("\n".join(lines)))
        elif isinstance(ev, E.Partitioned):
            lines = [f"**{len(ev.groups or [])} fusion group(s):**"]
            lines += [f"- group {g['id']} ({g['family']}): {' -> '.join(g['ops'])}" for g in ev.groups or []]
            lines += [f"- stays PyTorch: `{t['op']}`: {t['why']}" for t in ev.torch_ops or []]
            self._blocks.append(say("\n".join(lines)))
        elif isinstance(ev, E.ModuleCheck):
            self._blocks.append(say(f"**Whole-module check:** {ev.status}: {plain(ev.reason)}"))
        elif isinstance(ev, E.ModuleTime):
            self._blocks.append(say(f"**End to end:** ModelNew {ev.ours_ms} ms, PyTorch eager "
                                    f"{ev.eager_ms} ms, torch.compile {ev.compiled_ms} ms"))
        elif isinstance(ev, (E.Rejected, E.Final)):
            self.final = ev.to_dict()
            self._blocks.append(say(final_text(ev.message) if isinstance(ev, E.Final) else plain(ev.message)))

    def phase(self) -> str:
        """What the module flow is doing now, in words (for a run that has been quiet a while)."""
        if self.final is not None:
            return "writing the answer"
        if not self._blocks:
            return ("capturing the module in a sandboxed child: importing it, building Model, running its "
                    f"forward on fake tensors and tracing it (stopped after {_capture_timeout()})")
        if not self.groups:
            return "splitting the captured graph into fusion groups"
        running = [f"group {gid}: {s.phase()}" for gid, s in self.groups.items()
                   if self._heads[gid]["metadata"]["status"] == "pending"]
        if running:
            return "; ".join(running)
        if not any(isinstance(b, dict) and "Whole-module check" in b["content"] for b in self._blocks):
            return "checking the whole ModelNew against Model (the guard: sandboxed children, fresh inputs)"
        return "timing ModelNew and writing the report"

    def time_table(self) -> pd.DataFrame:
        parts = [time_table(s.records, s.baselines, label=f"group {gid}") for gid, s in self.groups.items()]
        return pd.concat(parts, ignore_index=True) if parts else time_table([], None)


def _capture_timeout() -> str:
    try:
        from mtmc.agents.module_flow import CAPTURE_TIMEOUT_S
    except ImportError:
        return "its timeout"
    return f"{CAPTURE_TIMEOUT_S:g} s"


def report_table(summary: dict) -> pd.DataFrame:
    rows = []
    for g in summary.get("groups") or []:
        kernel = g["status"] == "kernel"
        t = g.get("time_after_ms")
        rows.append([g["id"], " -> ".join(g["ops"]),
                     f"Triton {g['op']}" if kernel else f"PyTorch ({g.get('reason', '')})",
                     g.get("correctness") or "-", round(t, 5) if kernel and isinstance(t, (int, float)) else None,
                     "measured" if g.get("measured") else "estimate, no GPU"])
    return pd.DataFrame(rows, columns=REPORT_COLUMNS)


def report_html(table: pd.DataFrame) -> str:
    """The report table as HTML that fits its panel: cells wrap between words (a header never
    inside one), and a panel too narrow for even that scrolls instead of cutting columns off."""
    if table.empty:
        return REPORT_PLACEHOLDER
    cell = "padding:4px 6px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top"
    head = "".join(f'<th style="{cell};word-break:normal;overflow-wrap:normal">{escape(c)}</th>' for c in table.columns)
    rows = "".join("<tr>" + "".join(f'<td style="{cell};overflow-wrap:break-word">'
                                     f'{"" if v is None or v != v else escape(str(v))}</td>' for v in row) + "</tr>"
                   for row in table.itertuples(index=False))
    return (f'<div class="mtmc-report" style="overflow-x:auto;max-width:100%">'
            f'<div style="font-size:var(--block-label-text-size);margin-bottom:4px">Module report</div>'
            f'<table style="width:100%;border-collapse:collapse;font-size:13px"><thead><tr>{head}</tr></thead>'
            f'<tbody>{rows}</tbody></table></div>')


def roofline_points(summary: dict, profile: HardwareProfile) -> list[dict]:
    return [kernel_point(g["spec"], g["time_after_ms"], profile, bool(g.get("measured")), name=f"group {g['id']}: {g['op']}")
            for g in summary.get("groups") or []
            if g["status"] == "kernel" and isinstance(g.get("time_after_ms"), (int, float)) and g.get("same_as") is None]


_QUIET = {"why", "not", "did", "you", "the", "fuse", "fused", "fusing", "fusion", "into", "with", "and", "was",
          "this", "that", "what", "how", "are", "were", "does", "isn", "didn", "one", "kernel", "group"}


def fusion_answer(question: str, summary: dict) -> str:
    """Why ops were (not) fused, from the module's split into groups: which group took each op,
    and why the ops left to PyTorch stayed there; the ops the question names come first."""
    words = {w for w in "".join(c if c.isalnum() else " " for c in question.lower()).split()
             if len(w) > 2 and w not in _QUIET}

    def named(text: str) -> bool:
        return any(w in text.lower() for w in words)

    groups, left = summary.get("groups") or [], summary.get("torch_ops") or []
    hit_groups = [g for g in groups if named(" ".join(g["ops"]) + " " + g.get("description", ""))]
    hit_left = [t for t in left if named(t["op"])]
    lines = [f"Fusion in `{summary.get('file')}` was decided when the captured graph was split into groups: "
             "a group is one catalog kernel (a matmul with its epilogue, a reduction / softmax / norm with "
             "its prologue and epilogue, or a pointwise chain), and a node joins a group only when all its "
             "users are in it, so the kernel returns exactly what the nodes did."]
    if not (hit_groups or hit_left):
        if words:
            lines.append(f"No captured op matches '{' '.join(sorted(words))}'; here is the whole split.")
        hit_groups, hit_left = groups, left
    for g in hit_groups:
        lines.append(f"- group {g['id']} ({g['family']}/{g['op']}) fuses {' -> '.join(g['ops'])}: "
                     + ("Triton kernel" if g["status"] == "kernel" else f"left to PyTorch ({g.get('reason')})"))
        lines += [f"  - note: {n}" for n in g.get("notes") or []]
    for t in hit_left:
        lines.append(f"- `{t['op']}` stays PyTorch: {t['why']}")
    rewrites = rewrite_answer(question, summary)
    if rewrites:
        lines += ["", *rewrites]
    replayed = replay_answer(question, summary)
    if replayed:
        lines += ["", *replayed]
    return "\n".join(lines)
