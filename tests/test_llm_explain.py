"""Why-answers with an LLM: prose written from the recorded facts, sent through the real
ChatOpenAI client to a local OpenAI-compatible server (the `chat_server` fixture), the facts
shown under it, and every way the model can fail ending in the structured answer plus a note.
The run is a hand-written record (no kernel runs here)."""
import pytest

from mtmc.commands import cli
from mtmc.tools import llm as chat_model
from mtmc.agents.explainer import FACTS_HEAD, explain, unsupported_numbers
from mtmc.memory import Store
from mtmc.memory.records import HistoryRecord
from mtmc.request.parse import parse_request
from mtmc.tools.hardware import get_profile
from mtmc.ui.settings import Settings, llm_status

SPEC = parse_request("matmul of 512x512 by 512x256 in fp16").spec.to_dict()
CFG0 = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}


def _verdict(regs, ms):
    return {"ok": True, "stage": "done", "kind": None, "detail": "", "measured": False, "time_ms": ms,
            "timing": {"measured": False, "label": "roofline model, no GPU"},
            "correctness": {"ok": True, "reason": "matches the float64 reference on 2 fresh random inputs",
                            "max_rel_err": 0.031, "dims": SPEC["dims"], "device": "cpu"},
            "resources": {"target": "NVIDIA H200", "kernels": [
                {"name": "matmul_kernel", "num_warps": 4, "regs": regs, "spill_bytes": 0,
                 "shared_bytes": 49152, "blocks_per_sm": 4, "occupancy": 0.5}]}}


STEP1 = {"step": 1, "origin": "planner", "action": {"kind": "set", "knob": "BLOCK_M", "value": 128},
         "reason": "a taller tile reuses each B tile twice as often; the roofline model predicts the largest gain",
         "alternatives": [{"action": "BLOCK_M=128", "prob": 0.41, "predicted_ms": 0.0213},
                          {"action": "num_warps=8", "prob": 0.27, "predicted_ms": 0.0241},
                          {"action": "GROUP_M=4", "prob": 0.12, "predicted_ms": 0.0262}],
         "policy": "baseline: greedy one-knob search ranked by a roofline model",
         "outcome": "kept", "config": {**CFG0, "BLOCK_M": 128}, "verdict": _verdict(168, 0.0219),
         "history": {"warm_start": None, "retrieved": ["matmul-20261201-101010-abcdef"]}}
STATE = {"spec": SPEC,
         "steps": [{"step": 0, "origin": "template", "action": {"kind": "init", "knob": None, "value": None},
                    "reason": "first draft: the matmul template at its default config", "alternatives": [],
                    "config": CFG0, "verdict": _verdict(96, 0.0297)}, STEP1],
         "best": {**STEP1, "time_ms": 0.0219},
         "decision": {"action": {"kind": "stop"}, "reason": "no legal move predicts a gain over 2 %",
                      "alternatives": [{"action": "stop", "prob": 0.66}]}}
PAST = {"id": "matmul-20261201-101010-abcdef", "description": "matmul of 512x512 by 512x256 in float16",
        "final_config": {**CFG0, "BLOCK_M": 128}, "final_step": 2, "drafts": 3, "time_ms": 0.0205,
        "measured": True, "stale": False, "stale_reasons": []}


class Memory:
    """The one store call the explainer makes: similar past histories."""

    def similar(self, spec, gpu, k=3):
        return [PAST]


QUESTION = "why did you pick BLOCK_M=128 at step 1?"
OFFLINE = explain(QUESTION, STATE, Memory())


def _ask(server, timeout_s=5.0):
    return explain(QUESTION, STATE, Memory(), llm=chat_model.build(server.url, "stub-model", timeout_s=timeout_s))


def test_offline_the_answer_is_the_structured_facts():
    assert OFFLINE.startswith("Step 1: BLOCK_M=128 (by the planner); outcome: kept")
    assert "BLOCK_M=128: p=0.41, 0.0213 ms" in OFFLINE and "Estimated, not measured: 0.0219 ms" in OFFLINE
    assert PAST["id"] in OFFLINE and FACTS_HEAD not in OFFLINE


def test_with_an_llm_the_answer_is_its_prose_over_the_facts_it_was_given(chat_server):
    chat_server.reply = ("Step 1 set BLOCK_M=128 because the policy gave it p=0.41, ahead of num_warps=8 "
                         "at 0.27; the estimated time is 0.0219 ms, not a measurement.")
    answer = _ask(chat_server)
    prose, facts = answer.split(f"\n\n---\n{FACTS_HEAD}\n\n")
    assert prose == chat_server.reply                   # the model's words, no warning: all its numbers are facts
    assert facts == OFFLINE                             # and under them, the facts it was given
    sent = chat_server.requests[0]
    assert sent["model"] == "stub-model" and not sent.get("stream")
    system, user = (m["content"] for m in sent["messages"])
    assert "Do not invent numbers" in system
    assert user.startswith(f"Question: {QUESTION}") and OFFLINE in user
    for fact in ("BLOCK_M=128: p=0.41", "num_warps=8: p=0.27", "Hardware limits (NVIDIA H200)",
                 "168 registers/thread", "Estimated, not measured", PAST["id"]):
        assert fact in user


def test_numbers_the_facts_do_not_hold_are_flagged(chat_server):
    chat_server.reply = "BLOCK_M=128 ran in 0.0150 ms, 3.7x faster than step 0, with p=0.41."
    answer = _ask(chat_server)
    assert answer.startswith(chat_server.reply + "\n\nCheck: the text above quotes numbers that are not in the facts")
    assert "(0.0150, 3.7); trust the facts." in answer and answer.endswith(OFFLINE)


def test_a_reasoning_models_thinking_is_not_part_of_the_answer(chat_server):
    chat_server.reply = "<think>maybe p=0.99 or 512 warps?</think>\nStep 1 set BLOCK_M=128 (p=0.41)."
    assert _ask(chat_server) == f"Step 1 set BLOCK_M=128 (p=0.41).\n\n---\n{FACTS_HEAD}\n\n{OFFLINE}"


def test_the_number_check_allows_rounding_percentages_and_counts():
    facts = "p=0.41, 0.0383 ms; 168 registers of 255; BLOCK_M=128"
    assert unsupported_numbers("p=0.41 is 41%, about 0.04 ms or 0.038 ms; two of three, 3 alternatives, 128", facts) == []
    assert unsupported_numbers("256 registers and 0.05 ms, 52%", facts) == ["256", "0.05", "52%"]


@pytest.mark.parametrize("mode, reason", [
    ("status", "HTTP 500 (the model is overloaded)"),
    ("garbage", "malformed reply (JSONDecodeError"),
    ("empty", "empty reply"),
    ("sleep", "timed out after "),
    ("down", "connection refused"),
])
def test_when_the_llm_fails_the_answer_is_the_facts_and_says_why(chat_server, mode, reason):
    chat_server.mode = mode
    if mode == "down":
        chat_server.close()                              # nothing listens on the port any more
    answer = _ask(chat_server, timeout_s=0.5)
    note, rest = answer.split("\n\n", 1)
    assert note.startswith(f"(The LLM at {chat_server.url} could not be used: {reason}")
    assert note.endswith("The answer below is built from the records only.)") and "\n" not in note
    assert rest == OFFLINE


def test_no_llm_call_when_there_is_nothing_recorded_to_phrase(chat_server):
    answer = explain("why step 9?", STATE, Memory(), llm=chat_model.build(chat_server.url, "stub-model"))
    assert answer == explain("why step 9?", STATE, Memory()) and chat_server.requests == []
    assert answer.startswith("There is no step 9: the run recorded steps 0, 1.")


def test_offline_when_no_endpoint_and_status_says_what_the_llm_does():
    assert chat_model.build("", "m") is None and chat_model.build("http://x/v1", " ") is None
    assert "**offline**" in llm_status(Settings()) and "structured facts" in llm_status(Settings())
    on = llm_status(Settings(llm_base_url="http://localhost:8000/v1", llm_model="qwen"))
    assert "`qwen` at `http://localhost:8000/v1` writes the **why-answers**" in on and "offline" not in on


@pytest.mark.slow      # storing a history opens Chroma and loads the embedding model (~12 s)
def test_cli_why_uses_the_llm_from_the_environment(chat_server, monkeypatch, capsys):
    rec = HistoryRecord(id="matmul-20261202-000000-123456", created="2026-12-02T00:00:00+00:00",
                        request=SPEC["request"], spec=SPEC, gpu=get_profile("h200").to_dict(), versions={},
                        steps=STATE["steps"], final_config=STEP1["config"], final_step=1, source="",
                        time_ms=0.0219, measured=False, stop=STATE["decision"])
    Store().add(rec)
    assert cli.main(["memory", "why", rec.id[:-2], "why step 1?"]) == 0
    offline = capsys.readouterr().out
    assert offline.startswith("Step 1: BLOCK_M=128") and FACTS_HEAD not in offline

    chat_server.reply = "Step 1 took BLOCK_M=128, the top choice at p=0.41."
    monkeypatch.setenv("MTMC_LLM_BASE_URL", chat_server.url)
    monkeypatch.setenv("MTMC_LLM_MODEL", "stub-model")
    assert cli.main(["memory", "why", rec.id, "why step 1?"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(chat_server.reply) and FACTS_HEAD in out and "BLOCK_M=128: p=0.41" in chat_server.prompt()


def test_a_question_about_a_knob_gets_its_meaning_and_the_kept_value():
    """'what does BLOCK_K mean' was read as a new request for a mean; the answer names the knob."""
    from mtmc.ui.followup import interpret
    assert interpret("what does BLOCK_K mean?", SPEC, None, True).kind == "why"
    answer = explain("what does BLOCK_K mean?", STATE, Memory())
    assert answer.startswith("What the knobs named do")
    assert "- BLOCK_K: the slice of the reduction (K) dimension" in answer and "BLOCK_K=32" in answer
    assert "- SPLIT_K: the K loop cut" in explain("and what is split-k?", STATE, Memory())
