"""The chat app: its pieces on their own, then the launched `python app.py` driven through
gradio_client for each flow (request, follow-up, why, upload), with login, the run queue and
the file-serving limits."""
import math
import os
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mtmc.ui.followup import interpret
from mtmc.request.parse import parse_request
from mtmc.tools.hardware import PROFILES
from mtmc.ui.plots import kernel_point, roofline_svg, time_table
from mtmc.ui.runqueue import RunQueue, run_in_line
from mtmc.ui.steps import StepStream
from mtmc.ui.upload import MAX_UPLOAD_BYTES, UploadError, check_module

MODULES = Path(__file__).parent / "modules"
SOFTMAX = parse_request("softmax over the rows of a 4096x8192 fp16 tensor").spec.to_dict()
MATMUL = parse_request("matmul of 512x512 by 512x256 in fp16").spec.to_dict()


# -- follow-ups ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, kind, dims, dtype", [
    ("use bf16", "change", {"M": 4096, "N": 8192}, "bfloat16"),
    ("try it for 16384 columns", "change", {"M": 4096, "N": 16384}, "float16"),
    ("with 2048 rows", "change", {"M": 2048, "N": 8192}, "float16"),
    ("make it 8192x8192", "change", {"M": 8192, "N": 8192}, "float16"),
    ("make it [16, 128, 768] in fp32", "change", {"M": 2048, "N": 768}, "float32"),
])
def test_followup_changes_the_last_spec(text, kind, dims, dtype):
    f = interpret(text, SOFTMAX)
    assert f.kind == kind and f.spec["dims"] == dims and f.spec["dtype"] == dtype
    assert f.spec["family"] == "softmax" and text in f.spec["request"]
    assert f.changes and all("->" in c for c in f.changes)


def test_followup_questions_new_requests_and_unclear_sizes():
    assert interpret("why did you choose BLOCK_M=128 at step 3?", MATMUL).kind == "why"
    assert interpret("why step 2?", MATMUL).step == 2
    assert interpret("why not fuse the softmax?", SOFTMAX).kind == "why"
    assert interpret("layernorm of a 64x64 tensor", SOFTMAX).kind == "new"      # a whole request
    assert interpret("use bf16", None).kind == "new"                           # nothing to change yet
    assert interpret("hello", SOFTMAX).kind == "new"                           # the parser answers
    k = interpret("K=2048", SOFTMAX)
    assert k.kind == "unclear" and "no size for 'K'" in k.message
    assert interpret("K=2048", MATMUL).spec["dims"]["K"] == 2048
    assert interpret("make it 1024x1024x2048", MATMUL).spec["dims"] == {"M": 1024, "N": 1024, "K": 2048}
    assert interpret("make it 8192x8192", MATMUL).kind == "unclear"            # which two of M, N, K?


@pytest.mark.parametrize("text", ["how fast is it?", "what did step 2 change?", "what is BLOCK_N?",
                                  "can you make it faster?"])
def test_followup_questions_about_the_run_are_answered_from_its_records(text):
    assert interpret(text, SOFTMAX).kind == "why"                       # once: a new request the parser refused
    assert interpret(text, None, ran=True).kind == "why"                # after a module run too
    assert interpret(text, None).kind == "new"                          # nothing ran: the parser answers


def test_followup_capability_questions_and_whole_requests_stay_new():
    assert interpret("what can you do?", SOFTMAX).kind == "new"
    assert interpret("softmax of a 64x64 tensor?", SOFTMAX).kind == "new"


@pytest.mark.parametrize("text, op, dtype", [
    ("now layernorm instead", "layernorm", "float16"),
    ("what about gelu?", "chain", "float16"),
    ("gelu in bf16", "chain", "bfloat16"),
])
def test_followup_another_op_runs_on_the_last_tensor(text, op, dtype):
    f = interpret(text, SOFTMAX)   # the parser alone would take its default 4096x4096 float32
    assert f.kind == "change" and f.spec["op"] == op and f.spec["dtype"] == dtype
    assert f.spec["dims"] == {"M": 4096, "N": 8192}


# -- the run line -------------------------------------------------------------------------------
def test_runs_go_one_at_a_time_and_waiting_ones_see_their_place():
    line, release = RunQueue(), threading.Event()
    running, seen = [], {}

    def job(name, hold):
        def run(on_event):
            running.append(name)
            assert len(running) == 1, "two runs at once"
            on_event({"event": "hello", "who": name})
            if hold:
                release.wait(10)
            running.remove(name)
            return name
        return run

    def consume(name, hold):
        seen[name] = list(run_in_line(line, job(name, hold), poll_s=0.05))

    first = threading.Thread(target=consume, args=("a", True))
    first.start()
    time.sleep(0.2)
    second = threading.Thread(target=consume, args=("b", False))
    second.start()
    time.sleep(0.5)
    release.set()
    first.join(10), second.join(10)
    assert seen["a"] == [("event", {"event": "hello", "who": "a"}), ("done", "a")]
    assert seen["b"][0] == ("wait", 1) and seen["b"][-1] == ("done", "b")


def test_a_waiting_place_given_up_is_never_run():
    line = RunQueue()
    holder = line.join()
    assert line.wait_turn(holder)
    ran = []
    waiting = run_in_line(line, lambda on_event: ran.append(1), poll_s=0.05)
    assert next(waiting) == ("wait", 1)
    waiting.close()                      # the user left while waiting
    line.leave(holder)
    time.sleep(0.3)
    assert ran == [] and line.ahead(line.join()) == 0


# -- the step bubbles -----------------------------------------------------------------------------
def _verdict(ok=True, kind=None, ms=0.01):
    return {"ok": ok, "kind": kind, "stage": "done" if ok else "compile", "detail": "" if ok else "needs 300000 B",
            "time_ms": ms if ok else None, "measured": False,
            "timing": {"label": "estimate (no GPU): roofline model", "ideal_ms": 0.001},
            "correctness": {"reason": "matches the float64 reference", "max_rel_err": 0.1, "device": "cpu", "dims": {"M": 3}}
            if ok else None,
            "resources": {"target": "NVIDIA H200", "kernels": [{"name": "k", "regs": 40, "spill_bytes": 0, "shared_bytes": 0}]}}


def test_events_become_one_bubble_per_step_pending_then_done():
    s = StepStream()
    s.feed({"event": "parsed", "description": "softmax of 4x8", "assumptions": ["fp32"], "spec": SOFTMAX})
    s.feed({"event": "retrieved", "count": 2})
    s.feed({"event": "code", "step": 0, "config": {"BLOCK_N": 8}, "diff": "", "origin": "template"})
    assert s.messages[-1]["metadata"]["status"] == "pending"
    s.feed({"event": "verify", "step": 0, "verdict": _verdict()})
    s.feed({"event": "step", "step": 0, "origin": "template", "action": {"kind": "init"}, "reason": "first draft",
            "alternatives": [], "config": {"BLOCK_N": 8}, "verdict": _verdict(), "time_ms": 0.01, "outcome": "accepted"})
    s.feed({"event": "plan", "step": 1, "action": {"kind": "warps", "knob": "num_warps", "value": 8},
            "reason": "more warps", "alternatives": [{"action": "num_warps=8", "prob": 0.6, "predicted_ms": 0.008},
                                                     {"action": "stop", "prob": 0.4, "predicted_ms": 0.01}]})
    s.feed({"event": "code", "step": 1, "config": {"BLOCK_N": 8, "num_warps": 8}, "diff": "--- before.py\n+++ after.py\n-a\n+b",
            "origin": "planner"})
    s.feed({"event": "verify", "step": 1, "verdict": _verdict(False, "smem_overflow")})
    s.feed({"event": "debug", "step": 1, "fix": "num_stages=2", "reason": "fewer stages need less shared memory"})
    bubble = s.messages[-1]
    assert bubble["metadata"]["title"] == "Step 1 · planner: num_warps=8"
    assert bubble["metadata"]["status"] == "pending" and "smem_overflow" in bubble["metadata"]["log"]
    s.feed({"event": "step", "step": 1, "origin": "planner", "action": {"kind": "warps", "knob": "num_warps", "value": 8},
            "verdict": _verdict(False, "smem_overflow"), "outcome": "failed; debugger: num_stages=2"})
    s.feed({"event": "code", "step": 2, "config": {"num_stages": 2}, "diff": "", "origin": "debugger"})
    s.feed({"event": "plan", "step": 3, "action": {"kind": "stop"}, "reason": "budget used", "alternatives": []})
    s.feed({"event": "final", "status": "done", "message": "softmax: best draft is step 0.\nKernel file: /x.py"})
    intake, step0, step1, step2, stop, final = s.messages
    assert "softmax of 4x8" in intake["content"] and "assumed: fp32" in intake["content"] and "memory: 2" in intake["content"]
    assert step0["metadata"]["status"] == "done" and "**Outcome:** accepted" in step0["content"]
    assert "Against PyTorch" in step0["content"] and "estimate" in step0["content"]
    assert "| `num_warps=8` | 0.60 |" in step1["content"] and "```diff" in step1["content"]
    assert "Debugger:** num_stages=2" in step1["content"] and step1["metadata"]["status"] == "done"
    assert step2["metadata"]["title"].startswith("Step 2 · debugger") and "fewer stages" in step2["content"]
    assert stop["metadata"]["title"] == "Planner: stop" and "budget used" in stop["content"]
    assert final["content"].startswith("**softmax: best draft is step 0.**")
    assert [r["step"] for r in s.records] == [0, 1]


def test_plots_show_each_step_and_place_the_kernel_under_the_roof():
    records = [{"step": 0, "verdict": _verdict(ms=0.02), "time_ms": 0.02},
               {"step": 1, "verdict": _verdict(False, "smem_overflow"), "time_ms": None},
               {"step": 2, "verdict": {**_verdict(ms=0.01), "measured": True}, "time_ms": 0.01}]
    table = time_table(records, {"eager_ms": 0.05, "compile_ms": 0.03})
    rows = set(map(tuple, table.values.tolist()))
    assert (0, 0.02, "kernel (estimate, no GPU)") in rows and (2, 0.01, "kernel (measured)") in rows
    assert (2, 0.05, "PyTorch eager") in rows and (0, 0.03, "torch.compile") in rows and len(rows) == 6
    point = kernel_point(SOFTMAX, 0.05, PROFILES["h200"], measured=False)
    assert 0 < point["of_roof"] <= 1 and point["gbs"] > 100
    svg = roofline_svg([point], PROFILES["h200"])
    assert svg.startswith("<svg") and "NVIDIA H200" in svg and "estimate, no GPU" in svg and "<circle" in svg


def _svg_numbers(svg, cls):
    return [(float(m.group(2)), m.group(3)) for m in
            re.finditer(rf'<text class="{cls}" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg)]


def test_the_time_plot_shows_one_step_rounded_labels_in_order_and_a_line_per_group():
    from mtmc.ui.plots import time_svg
    one = time_svg(time_table([{"step": 0, "verdict": _verdict(ms=0.0049520771), "time_ms": 0.0049520771}], None))
    assert one.count("<circle") == 1 and 'data-step="0"' in one         # one step is a visible dot
    assert [t for _, t in _svg_numbers(one, "x-tick")] == ["0"]           # whole steps only
    labels = [t for _, t in _svg_numbers(one, "y-tick")]
    assert labels and all(len(t.replace("0.", "").lstrip("0")) <= 3 for t in labels), labels   # rounded
    assert "0.0049520771" not in re.sub(r"<title>.*?</title>", "", one)
    # mid-run values: a larger time sits higher (smaller y) and the labels rise with it
    steps = [{"step": i, "verdict": _verdict(ms=ms), "time_ms": ms} for i, ms in enumerate([0.135, 0.092, 0.11])]
    many = time_svg(time_table(steps, None))
    ys = {float(m.group(2)): float(m.group(1)) for m in re.finditer(r'cy="([\d.]+)"[^>]*data-ms="([\d.e-]+)"', many)}
    assert ys[0.135] < ys[0.11] < ys[0.092]
    ticks = _svg_numbers(many, "y-tick")
    assert [float(t) for _, t in sorted(ticks, reverse=True)] == sorted(float(t) for _, t in ticks)
    assert [t for _, t in _svg_numbers(many, "x-tick")] == ["0", "1", "2"]
    # a module: one line per group, each with its own dots
    from mtmc.ui.module_view import ModuleStream
    m = ModuleStream()
    for gid, times in ((0, [0.02, 0.015]), (1, [0.03])):
        m.feed({"event": "group_start", "group": gid, "ops": ["x"], "description": f"group {gid}"})
        for i, ms in enumerate(times):
            m.feed({"event": "code", "group": gid, "step": i, "config": {}, "diff": "", "origin": "template"})
            m.feed({"event": "step", "group": gid, "step": i, "origin": "template", "action": {"kind": "init"},
                    "verdict": _verdict(ms=ms), "time_ms": ms, "outcome": "accepted"})
    svg = time_svg(m.time_table())
    series = re.findall(r'<g class="series" data-series="([^"]+)">(.*?)</g>', svg)
    assert [name for name, _ in series] == ["group 0 (estimate, no GPU)", "group 1 (estimate, no GPU)"]
    assert [body.count("<circle") for _, body in series] == [2, 1]


def test_suggested_questions_are_ones_the_run_can_answer():
    """Offline runs often stop at step 0: "why step 1?" would get "There is no step 1"."""
    from mtmc.agents.explainer import explain
    from mtmc.ui.layout import INTRO
    rec = {"step": 0, "origin": "template", "action": {"kind": "init"}, "reason": "first draft", "alternatives": [],
           "config": {"BLOCK_N": 8}, "verdict": _verdict(), "time_ms": 0.01, "outcome": "accepted"}
    stop = {"action": {"kind": "stop"}, "reason": "no move is predicted to gain 1%", "alternatives": []}
    state = {"spec": SOFTMAX, "steps": [rec], "best": {**rec}, "decision": stop}
    s = StepStream()
    s.feed({"event": "parsed", "description": "softmax", "assumptions": [], "spec": SOFTMAX})
    s.feed({"event": "code", "step": 0, "config": {"BLOCK_N": 8}, "diff": "", "origin": "template"})
    s.feed({"event": "step", **rec})
    s.feed({"event": "plan", "step": 1, **stop})
    s.feed({"event": "final", "status": "done", "message": "softmax: best draft is step 0.\nKernel file: /x.py"})
    suggested = re.findall(r"\*(why [^*]*\?)\*", s.messages[-1]["content"])
    offered = re.findall(r"\*(why [^*]*\?)\*", INTRO)
    assert suggested and offered
    for question in suggested + offered:
        answer = explain(question, state)
        assert "There is no step" not in answer and "did not stop" not in answer, (question, answer)


def test_the_queue_says_gpu_only_where_there_is_one():
    from mtmc.ui.chat import Chat
    line = RunQueue()
    holder = line.join()
    assert line.wait_turn(holder)                         # someone else's run holds the line
    turn = Chat(line).respond({"text": "relu on a 64x64 fp32 tensor"}, [], None, {})
    try:
        for update in turn:
            queued = [m for m in update["chat"] if (m.get("metadata") or {}).get("title") == "In the queue"]
            if queued:
                break
    finally:
        turn.close()
        line.leave(holder)
    text = queued[0]["content"]
    assert "1 run ahead of you" in text
    assert "Waiting for the GPU" not in text and "no GPU" in text     # this machine has none (CI, here)


def _fake_run(monkeypatch, release, events=()):
    """chat.run_request replaced by a run that reports `events` and waits for `release`."""
    from mtmc.ui import chat as chat_module

    def fake(text, ctx, thread_id=None, on_event=None, spec=None):
        for ev in events:
            on_event(ev)
        release.wait(30)
        if isinstance(release.outcome, Exception):
            raise release.outcome
        return {"status": "failed"}
    release.outcome = None
    monkeypatch.setattr(chat_module, "run_request", fake)


def _contents(update):
    return [m["content"] for m in update["chat"]]


def test_a_message_sent_during_a_run_is_queued_visibly_and_answered_after_it(monkeypatch):
    from mtmc.ui.chat import Chat
    release = threading.Event()
    _fake_run(monkeypatch, release, [{"event": "parsed", "description": "relu", "assumptions": [], "spec": SOFTMAX}])
    chat, seen = Chat(), []
    first = chat.respond({"text": "relu on a 64x64 fp32 tensor"}, [], None, {})
    opening = next(first)
    thread = opening["thread"]
    runner = threading.Thread(target=lambda: seen.extend(first))
    runner.start()
    time.sleep(0.5)
    second = list(chat.respond({"text": "why did you stop?"}, opening["chat"], thread, {}))
    assert len(second) == 1 and second[0]["box"] == {"text": "", "files": []}      # answered at once ...
    shown = _contents(second[0])
    assert shown[0] == "relu on a 64x64 fp32 tensor" and shown[-2] == "why did you stop?"
    assert "A run is in progress" in shown[-1] and "queued" in shown[-1]          # ... saying it waits
    release.set()
    runner.join(30)
    final = _contents(seen[-1])
    assert final.index("why did you stop?") < len(final) - 1                         # then answered
    assert not any("A run is in progress" in c for c in final)
    assert "nothing to explain yet" in final[-1]
    assert not chat._running                                                         # the conversation is free


def test_a_page_that_sends_before_the_last_answer_arrived_keeps_the_whole_conversation(monkeypatch):
    from mtmc.ui.chat import Chat
    release = threading.Event()
    release.set()
    _fake_run(monkeypatch, release)
    chat = Chat()
    first = list(chat.respond({"text": "relu on a 64x64 fp32 tensor"}, [], None, {}))
    thread = first[0]["thread"]
    stale = []                                       # the page had not yet received the first answer
    after = _contents(list(chat.respond({"text": "why step 0?"}, stale, thread, {}))[-1])
    assert after[:len(first[-1]["chat"])] == _contents(first[-1]) and after[-2] == "why step 0?"


def test_a_quiet_run_says_what_it_is_doing_and_for_how_long(monkeypatch):
    from mtmc.ui import services
    from mtmc.ui.chat import Chat

    def sleepy(path, ctx, out, report, on_event=None):     # an upload whose import sleeps
        time.sleep(1.5)
        on_event({"event": "rejected", "message": "sleepy.py: importing the file did not finish within 1 s"})
        return {"status": "rejected"}

    monkeypatch.setattr(services, "module_optimizer", lambda: sleepy)
    start = time.monotonic()
    updates = list(Chat(tick_s=0.1, quiet_s=0.5).respond({"text": "", "files": [str(MODULES / "linear_bias_relu.py")]},
                                                           [], None, {}))
    took = time.monotonic() - start
    working = [m["content"] for u in updates for m in u["chat"] if (m.get("metadata") or {}).get("title") == "Working"]
    assert working and "capturing the module" in working[-1] and "importing it" in working[-1]
    # the seconds it had been waiting when last said: at least 1 (it slept 1.5 s), at most the
    # whole call (CI saw 2 s on a loaded machine)
    seconds = re.search(r"\b(\d+) s on this so far", working[-1])
    assert seconds and 1 <= int(seconds.group(1)) <= math.ceil(took) + 1, working[-1]
    assert not any((m.get("metadata") or {}).get("title") == "Working" for m in updates[-1]["chat"])   # gone at the end


def test_messages_that_quote_code_show_it_literally(monkeypatch):
    from markdown_it import MarkdownIt
    from mtmc.ui.chat import Chat
    from mtmc.ui.module_view import ModuleStream
    md = MarkdownIt("commonmark")
    release = threading.Event()
    _fake_run(monkeypatch, release)
    release.outcome = RuntimeError("Model.__init__ failed: Model(*get_init_inputs()) at <module> line 3")
    release.set()
    error = Chat().respond({"text": "relu on a 64x64 fp32 tensor"}, [], None, {})
    m = ModuleStream()
    m.feed({"event": "rejected", "message": "net.py: building Model(*get_init_inputs()) failed in __init__: **x"})
    for text in (list(error)[-1]["chat"][-1]["content"], m.messages[-1]["content"]):
        html = md.render(text)
        assert "<strong>" not in html and "<em>" not in html, html
        assert "__init__" in html and "*get_init_inputs()" in html


# -- uploads -------------------------------------------------------------------------------------
def test_uploads_are_checked_without_running_them(tmp_path):
    kept = check_module(MODULES / "linear_bias_relu.py")
    assert kept.read_text() == (MODULES / "linear_bias_relu.py").read_text() and kept.parent.parent.name == "uploads"
    bad = {"notes.txt": "class Model: pass", "broken.py": "def (:", "nomodel.py": "def get_inputs(): pass",
           "big.py": "#" * (MAX_UPLOAD_BYTES + 1),
           "boom.py": "raise SystemExit('ran!')\nclass Model: pass\ndef get_inputs(): pass\ndef get_init_inputs(): pass"}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
    msgs = {}
    for name in bad:
        try:
            check_module(tmp_path / name)
        except UploadError as exc:
            msgs[name] = str(exc)
    assert "only Python modules" in msgs["notes.txt"] and "not valid Python" in msgs["broken.py"]
    assert "missing: Model, get_init_inputs" in msgs["nomodel.py"] and "limit" in msgs["big.py"]
    assert "boom.py" not in msgs   # valid format: accepted, and checking it did not execute it


def test_login_comes_from_the_environment_and_leaves_it(monkeypatch):
    from mtmc.ui.settings import auth_from_env
    monkeypatch.setenv("MTMC_AUTH", "ann:pw1,bob:pw:2")
    assert auth_from_env() == [("ann", "pw1"), ("bob", "pw:2")]
    assert "MTMC_AUTH" not in os.environ     # sandboxed children inherit MTMC_* variables
    monkeypatch.setenv("MTMC_AUTH", "nocolon")
    with pytest.raises(ValueError):
        auth_from_env()


# -- modules ------------------------------------------------------------------------------------
SUMMARY = {"file": "net.py", "groups": [
    {"id": 0, "ops": ["linear (line 9)", "add (line 10)", "relu (line 11)"], "family": "matmul", "op": "matmul",
     "description": "matmul then bias -> relu", "status": "kernel", "reason": "", "notes": ["bias expanded"],
     "spec": MATMUL, "time_after_ms": 0.01, "measured": False, "same_as": None, "correctness": "ok"},
    {"id": 1, "ops": ["softmax (line 12)"], "family": "softmax", "op": "softmax", "description": "softmax",
     "status": "fallback", "reason": "breaks the module check", "notes": [], "spec": SOFTMAX,
     "time_after_ms": 0.02, "measured": False, "same_as": None, "correctness": None}],
    "torch_ops": [{"op": "conv2d (line 8)", "graph": "", "why": "outside the kernel catalog"}]}


def test_module_events_nest_each_groups_steps_under_its_bubble():
    from mtmc.ui.module_view import ModuleStream
    m = ModuleStream()
    m.feed({"event": "captured", "graphs": [""], "problems": []})
    m.feed({"event": "partitioned", "groups": [{"id": 0, "ops": ["linear"], "family": "matmul"}],
            "torch_ops": [{"op": "conv2d", "why": "outside the kernel catalog"}]})
    m.feed({"event": "group_start", "group": 0, "ops": ["linear"], "description": "matmul 24x48"})
    m.feed({"event": "code", "group": 0, "step": 0, "config": {"BLOCK_M": 32}, "diff": "", "origin": "template"})
    m.feed({"event": "step", "group": 0, "step": 0, "origin": "template", "action": {"kind": "init"}, "reason": "first",
            "verdict": _verdict(), "time_ms": 0.01, "outcome": "accepted"})
    m.feed({"event": "final", "group": 0, "status": "done", "message": "matmul: done", "history_id": "matmul-1"})
    m.feed({"event": "group_done", "group": 0, "status": "kernel", "reason": "the catalog serves it"})
    m.feed({"event": "module_check", "status": "passed", "reason": "matches Model"})
    m.feed({"event": "final", "status": "done", "message": "net.py: 1 fusion group(s)\nCheck: passed"})
    captured, split, head, step0, result, check, final = m.messages
    assert "conv2d`: outside the kernel catalog" in split["content"]
    assert head["metadata"]["id"] == "group-0" and head["metadata"]["status"] == "done" and "kernel" in head["content"]
    assert step0["metadata"]["parent_id"] == "group-0" and step0["metadata"]["id"] == "group-0/step-0"
    assert result["metadata"]["parent_id"] == "group-0" and m.histories == {0: "matmul-1"}
    assert "passed" in check["content"] and m.final["status"] == "done"
    assert list(m.time_table()["series"]) == ["group 0 (estimate, no GPU)"]


def test_fusion_questions_are_answered_from_the_split():
    from mtmc.ui.module_view import fusion_answer, report_table, roofline_points
    conv = fusion_answer("why not fuse the conv2d?", SUMMARY)
    assert "`conv2d (line 8)` stays PyTorch: outside the kernel catalog" in conv and "group 0" not in conv
    relu = fusion_answer("why did you fuse the relu into the matmul?", SUMMARY)
    assert "group 0 (matmul/matmul) fuses linear (line 9) -> add (line 10) -> relu (line 11)" in relu
    assert "note: bias expanded" in relu and "conv2d" not in relu
    unknown = fusion_answer("why not fuse the attention?", SUMMARY)
    assert "No captured op matches 'attention'" in unknown and "group 1" in unknown and "conv2d" in unknown
    table = report_table(SUMMARY)
    assert table.values.tolist()[1][2] == "PyTorch (breaks the module check)" and table["time after (ms)"][0] == 0.01
    assert [p["name"] for p in roofline_points(SUMMARY, PROFILES["h200"])] == ["group 0: matmul"]


def test_missing_parts_are_said_in_words_and_the_rest_keeps_working(monkeypatch):
    from mtmc.ui import services
    from mtmc.ui.chat import Chat
    real = services._optional

    def without(module, attr):
        if module in ("mtmc.agents.module_flow", "mtmc.agents.explainer"):
            raise services.Unavailable(f"{module} cannot be imported")
        return real(module, attr)

    monkeypatch.setattr(services, "_optional", without)
    parts = services.availability()
    assert parts["Module optimization"] == "not available in this build" and parts["Explainer"] == parts["Module optimization"]
    assert parts["Memory"].startswith("available")
    assert services.explain("why?", {"steps": []}).startswith("The explainer is not available here")
    chat = list(Chat().respond({"text": "", "files": [str(MODULES / "linear_bias_relu.py")]}, [], None, {}))[-1]["chat"]
    assert chat[-1]["content"].startswith("Module optimization is not available in this build")


# -- the launched app -----------------------------------------------------------------------------
# One app for the tests below, which run in file order as a user would: the request, then its
# follow-up and why-questions in the same conversation, then an upload, history and settings.
AUTH = ("tester", "s3cret")


@pytest.fixture(scope="module")
def app_home(tmp_path_factory):
    return tmp_path_factory.mktemp("app-home")


@pytest.fixture(scope="module")
def app_url(app_home):
    from mtmc.ui.process import running_app
    # these tests drive the UI through one planner move and its why-answer: the greedy baseline
    # takes that move offline, the learned policy (trained on 6 specs) stops at step 0 for this request
    env = {"MTMC_HOME": str(app_home), "MTMC_MAX_STEPS": "1", "MTMC_AUTH": ":".join(AUTH), "MTMC_PLANNER": "baseline"}
    with running_app(env, log=app_home / "app.log", flags=False) as url:   # GRADIO_SERVER_NAME / _PORT
        yield url


@pytest.fixture(scope="module")
def client(app_url):
    from gradio_client import Client
    return Client(app_url, auth=AUTH, verbose=False)


def _ask(client, text="", files=()):
    """Submit one chat message; returns every streamed update as a dict of the outputs by name."""
    from gradio_client import handle_file
    job = client.submit({"text": text, "files": [handle_file(str(f)) for f in files]}, api_name="/chat")
    job.result(timeout=600)
    names = ["chat", "box", "code", "download", "times", "roofline", "report"]
    return [dict(zip(names, out)) for out in job.outputs()]


def _text(msg):
    c = msg["content"]
    return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c if isinstance(p, dict))


def _last(updates, key):
    """The last value `key` took; a component update counts when it carries a value."""
    vals = [u[key].get("value") if isinstance(u[key], dict) and u[key].get("__type__") == "update" else u[key]
            for u in updates if not (isinstance(u[key], dict) and u[key].get("__type__") == "update"
                                     and "value" not in u[key])]
    return vals[-1] if vals else None


def test_without_login_nothing_is_served(app_url):
    from gradio_client import Client
    with pytest.raises(Exception):
        Client(app_url, verbose=False)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(app_url + "gradio_api/info")
    assert err.value.code in (401, 403)


@pytest.mark.slow
def test_request_streams_steps_and_ends_with_a_kernel_after_waiting_its_turn(app_url, client):
    from gradio_client import Client
    other, theirs = Client(app_url, auth=AUTH, verbose=False), {}
    ahead = threading.Thread(target=lambda: theirs.update(u=_ask(other, "rmsnorm of a 64x256 fp32 tensor")))
    ahead.start()
    time.sleep(1.5)                      # their run holds the line; ours must wait and say so
    updates = _ask(client, "matmul of 256x256 by 256x128 in fp16")
    ahead.join(600)
    assert "best draft is step" in _text(_last(theirs["u"], "chat")[-1])
    waits = [m for u in updates if isinstance(u["chat"], list) for m in u["chat"]
             if (m.get("metadata") or {}).get("title") == "In the queue"]
    assert waits and "1 run ahead of you" in _text(waits[0])
    chats = [u["chat"] for u in updates if isinstance(u["chat"], list)]
    titles = [[(m.get("metadata") or {}).get("title") for m in c] for c in chats]
    statuses = [(m.get("metadata") or {}).get("status") for c in chats for m in c]
    assert "pending" in statuses, "steps stream while they run"
    final_chat = chats[-1]
    assert "Step 0 · first draft (template)" in titles[-1] and any(t and t.startswith("Step 1 · planner") for t in titles[-1])
    step1 = next(m for m in final_chat if ((m.get("metadata") or {}).get("title") or "").startswith("Step 1"))
    body = _text(step1)
    assert "| alternative | probability |" in body and "```diff" in body and "regs" in body and "estimate" in body
    assert "best draft is step" in _text(final_chat[-1])
    code, download = _last(updates, "code"), _last(updates, "download")
    assert "@triton.jit" in code and "float16" in code
    assert Path(download).read_text().strip() == code.strip()
    times = _last(updates, "times")
    assert set(re.findall(r'data-step="(\d+)"', times)) == {"0", "1"}
    assert "final kernel (step" in _last(updates, "roofline")


@pytest.mark.slow
def test_followup_reruns_the_same_conversation_with_the_change(client):
    updates = _ask(client, "use bf16")
    chat = _last(updates, "chat")
    assert "Follow-up on the last kernel: dtype float16 -> bfloat16." in [_text(m) for m in chat]
    assert sum(_text(m) == "matmul of 256x256 by 256x128 in fp16" for m in chat) == 1   # same conversation
    assert "bfloat16" in _text(chat[-1]) and "best draft is step" in _text(chat[-1])
    assert "bfloat16" in _last(updates, "code")


def test_why_is_answered_from_the_recorded_decision(client):
    chat = _last(_ask(client, "why step 1?"), "chat")
    answer = _text(chat[-1])
    assert chat[-2]["role"] == "user" and chat[-1]["role"] == "assistant"
    assert "Step 1" in answer and "p=" in answer           # the alternatives with probabilities
    assert "H200" in answer and "Estimated, not measured" in answer
    assert "not available" not in answer
    unclear = _text(_last(_ask(client, "K=1x2"), "chat")[-1])
    assert unclear                                          # any text: answered, never a crash


def test_why_with_an_llm_in_the_settings_is_its_prose_over_the_facts(client, chat_server):
    chat_server.reply = "Step 1 was the planner's top-ranked move, and its time is an estimate, not a measurement."
    status = client.predict("auto", 1, chat_server.url, "stub-model", "", False, api_name="/save_settings")
    assert f"`stub-model` at `{chat_server.url}` writes the **why-answers**" in status
    try:
        answer = _text(_last(_ask(client, "why step 1?"), "chat")[-1])
        chat_server.mode = "status"
        failed = _text(_last(_ask(client, "why step 1?"), "chat")[-1])
    finally:
        client.predict("auto", 1, "", "", "", False, api_name="/save_settings")   # the tests below run offline
    prose, facts = answer.split("\n\n---\n", 1)
    assert prose == chat_server.reply
    assert facts.startswith("Facts from the run's records") and "Step 1" in facts and "p=" in facts
    assert "Step 1" in chat_server.prompt(0) and "p=" in chat_server.prompt(0) and "H200" in chat_server.prompt(0)
    assert failed.startswith(f"(The LLM at {chat_server.url} could not be used: HTTP 500") and "p=" in failed


def test_a_new_conversation_has_nothing_to_explain(app_url):
    from gradio_client import Client
    fresh = Client(app_url, auth=AUTH, verbose=False)
    assert "nothing to explain yet" in _text(_last(_ask(fresh, "why step 1?"), "chat")[-1])


def test_only_artifacts_are_served_and_big_uploads_are_refused(app_url, app_home):
    import httpx
    with httpx.Client(base_url=app_url) as browser:
        assert browser.post("login", data=dict(zip(("username", "password"), AUTH))).status_code == 200
        kernel = next((app_home / "artifacts").glob("*.py"))     # written by the runs above
        assert browser.get(f"gradio_api/file={kernel}").status_code == 200
        for secret in (app_home / "checkpoints.sqlite", Path(__file__).resolve(), Path("/etc/passwd"),
                       kernel.parent / ".." / "checkpoints.sqlite"):
            assert browser.get(f"gradio_api/file={secret}").status_code == 403, secret
        big = browser.post("gradio_api/upload", files={"files": ("big.py", b"#" * (MAX_UPLOAD_BYTES + 1))})
        assert big.status_code == 413


def test_uploads_that_are_not_modules_get_a_clear_answer(client, tmp_path):
    notes = tmp_path / "notes.py"
    notes.write_text("print('hello')\n")
    chat = _last(_ask(client, "", [notes]), "chat")
    assert chat[-2]["content"] and "notes.py" in _text(chat[-2])
    assert "not in the benchmark format" in _text(chat[-1])
    (tmp_path / "notes.txt").write_text("class Model: pass")
    with pytest.raises(Exception, match="Invalid file type"):    # the server takes .py only
        _ask(client, "", [tmp_path / "notes.txt"])
    (tmp_path / "huge.py").write_text("#" * (MAX_UPLOAD_BYTES + 1))
    with pytest.raises(Exception, match="maximum file size"):
        _ask(client, "", [tmp_path / "huge.py"])


@pytest.mark.slow
def test_upload_optimizes_the_module_group_by_group_and_answers_why(client):
    updates = _ask(client, "", [MODULES / "linear_bias_relu.py"])
    chat = _last(updates, "chat")
    meta = [m.get("metadata") or {} for m in chat]
    assert _text(chat[0]).startswith("Uploaded module `linear_bias_relu.py`") or any(
        _text(m).startswith("Uploaded module `linear_bias_relu.py`") for m in chat)
    heads = [m for m in meta if m.get("id") == "group-0"]
    assert heads and heads[0]["title"].startswith("Group 0: matmul") and heads[0]["status"] == "done"
    assert any(m.get("parent_id") == "group-0" and m.get("title", "").startswith("Step 0") for m in meta)
    assert any("Whole-module check:** passed" in _text(m) for m in chat)
    assert meta[-1].get("title") == "Report" and "| # | ops | kernel |" in _text(chat[-1])
    code = _last(updates, "code")
    assert "class ModelNew" in code and Path(_last(updates, "download")).read_text().strip() == code.strip()
    report = _last(updates, "report")
    assert re.search(r"<td[^>]*>0</td><td[^>]*>linear \(line 16\)[^<]*</td><td[^>]*>Triton matmul</td>", report), report
    assert "group 0: matmul" in _last(updates, "roofline")

    fuse = _text(_last(_ask(client, "why did you fuse the relu?"), "chat")[-1])
    assert "group 0 (matmul/matmul) fuses linear (line 16) -> add (line 17) -> relu (line 18)" in fuse
    step = _text(_last(_ask(client, "why step 0 in group 0?"), "chat")[-1])
    assert step.startswith("**Group 0**") and "Step 0: the first draft" in step and "H200" in step


def test_history_finds_and_opens_past_optimizations(client):
    rows = client.predict("matmul fp16", api_name="/search_history")
    table, _, note = rows
    ids = [r[0] for r in table["data"]]
    assert ids and "past optimization" in note
    assert any("256 x 256" in r[2] for r in table["data"])
    steps, source = client.predict(ids[0], api_name="/open_history")
    titles = [(m.get("metadata") or {}).get("title") for m in steps]
    assert any(t and t.startswith("Step 0") for t in titles) and "@triton.jit" in source


def test_settings_show_what_is_available_and_keep_the_endpoint(app_url):
    from gradio_client import Client
    status = Client(app_url, auth=AUTH, verbose=False).predict("h100", 2, "http://localhost:8000/v1", "qwen-coder", "sk-test",
                                      True, api_name="/save_settings")
    assert "GPU: **none**" in status and "NVIDIA H100 SXM" in status and "at most 2 planner steps" in status
    assert "**TF32 allowed** in uploaded modules" in status
    assert "`qwen-coder` at `http://localhost:8000/v1` writes the **why-answers**" in status
    assert "reads the requests the rule parser refuses" in status and "planning and coding stay deterministic" in status
    assert "sk-test" not in status
    assert "Memory: available" in status and "Explainer: available" in status and "Module optimization: available" in status
