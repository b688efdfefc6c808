"""The parser role with a model (issue 18), through the real ChatOpenAI client to the loopback
`chat_server`: the rules first; the model only when they refuse or are unsure; its JSON checked by
the family, bad replies asked again a bounded number of times, a dead endpoint never in the way of
what the rules serve; every call's latency and tokens recorded."""
import json

import pytest

from mtmc.request.llm_parse import read_request
from mtmc.request.parse import parse_request
from mtmc.tools import llm as chat_model

ODD = "turn each of the 64 rows of my 64-wide half activations into probabilities"   # the rules refuse it
SOFTMAX = {"family": "softmax", "op": "softmax", "dims": {"M": 64, "N": 64}, "dtype": "float16", "params": {}}


def _model(server, timeout_s=5.0):
    return chat_model.build(server.url, "stub-model", timeout_s=timeout_s)


def test_the_rules_refuse_the_odd_phrasing_so_the_model_is_asked():
    assert not parse_request(ODD).ok


@pytest.mark.parametrize("text", [ODD, "softmax over the rows of a 64x64 fp16 tensor", "64x64 times 64x64", "hello"])
def test_without_a_model_the_reading_is_the_rules(text):
    result, custom = read_request(text, None)
    assert custom is None and result == parse_request(text)


def test_a_request_the_rules_read_surely_never_calls_the_model(chat_server):
    calls = []
    result, _ = read_request("softmax over the rows of a 64x64 fp16 tensor", _model(chat_server), calls)
    assert result == parse_request("softmax over the rows of a 64x64 fp16 tensor")
    assert chat_server.requests == [] and calls == []


def test_the_models_spec_is_validated_and_used_with_its_cost_recorded(chat_server):
    chat_server.reply = json.dumps(SOFTMAX)
    calls = []
    result, custom = read_request(ODD, _model(chat_server), calls)
    assert result.ok and custom is None
    assert (result.spec.family, result.spec.op, result.spec.dims, result.spec.dtype) == \
        ("softmax", "softmax", {"M": 64, "N": 64}, "float16")
    assert result.spec.request == ODD
    assert result.assumptions[0].startswith(f"read by the model at {chat_server.url} (the rules could not: ")
    sent = chat_server.requests[0]
    assert sent["response_format"] == {"type": "json_object"}          # JSON mode where the server takes it
    system, user = (m["content"] for m in sent["messages"])
    assert "one JSON" in system and user.startswith(f"Request: {ODD}")
    assert "'softmax over the rows" in user or "softmax" in user     # the catalog by example
    assert calls == [{"role": "parser", "ok": True, "latency_s": calls[0]["latency_s"], "prompt_tokens": 1,
                      "completion_tokens": 1}]


def test_when_the_rules_were_unsure_their_reading_is_shown_beside_the_models(chat_server):
    chat_server.reply = json.dumps({"family": "elementwise", "op": "chain", "dims": {"M": 64, "N": 64},
                                    "dtype": "float32", "params": {"chain": [{"op": "mul"}]}})
    result, _ = read_request("64x64 times 64x64", _model(chat_server))
    assert result.spec.family == "elementwise"
    assert any(a.startswith("the rules read it as ") and "matmul" in a for a in result.assumptions)


def test_bad_replies_are_asked_again_with_their_reason(chat_server):
    chat_server.script = [("ok", "It is a softmax, I think."),                       # off-format
                          ("ok", json.dumps({**SOFTMAX, "dims": {"M": 64}})),        # the family refuses it
                          ("ok", "```json\n" + json.dumps(SOFTMAX) + "\n```")]       # fenced: fine
    calls = []
    result, _ = read_request(ODD, _model(chat_server), calls)
    assert result.ok and result.spec.op == "softmax"
    assert [c["ok"] for c in calls] == [False, False, True]
    assert "off-format" in calls[0]["error"] and calls[1]["error"].startswith("invalid: ")
    assert "could not be used (off-format" in chat_server.prompt(1)               # the model is told why


@pytest.mark.parametrize("script, reason", [
    ([("empty", "")] * 3, "empty reply"),
    ([("truncated", '{"family": "softmax", "op"')] * 3, "truncated reply"),
    ([("garbage", "")] * 3, "malformed reply"),
    ([("ok", '{"family": "fft", "op": "fft", "dims": {}}')] * 3, "invalid: family 'fft'"),
])
def test_bounded_retries_then_the_rules_answer_with_the_reason(chat_server, script, reason):
    chat_server.script = list(script)
    calls = []
    result, _ = read_request(ODD, _model(chat_server), calls)
    assert not result.ok and len(chat_server.requests) == chat_model.ATTEMPTS == len(calls)
    assert result.message.startswith(parse_request(ODD).message)
    assert f"could not be used (3 replies, none usable; the last: {reason}" in result.message


@pytest.mark.parametrize("mode, reason", [("status", "HTTP 500"), ("sleep", "timed out"),
                                          ("down", "connection refused")])
def test_a_failing_endpoint_is_reported_once_never_raised(chat_server, mode, reason):
    chat_server.mode = mode
    if mode == "down":
        chat_server.close()
    llm = _model(chat_server, timeout_s=0.5)
    calls = []
    result, _ = read_request(ODD, llm, calls)
    assert not result.ok and f"could not be used ({reason}" in result.message
    assert len(calls) == 1 and not calls[0]["ok"]
    # a dead endpoint never stops what the rules serve: a sure reading needs no call, an unsure one stands
    assert read_request("softmax over the rows of a 64x64 tensor", llm)[0] == \
        parse_request("softmax over the rows of a 64x64 tensor")
    unsure, _ = read_request("64x64 times 64x64", llm)
    assert unsure.spec == parse_request("64x64 times 64x64").spec
    assert unsure.assumptions[-1].endswith("the rules' reading stands")


def test_a_server_without_json_mode_is_asked_in_plain_text(chat_server):
    chat_server.status = 400
    chat_server.script = [("status", "")]
    chat_server.reply = json.dumps(SOFTMAX)
    llm = chat_model.build(chat_server.url, "no-json-mode-model")
    assert read_request(ODD, llm)[0].ok
    assert "response_format" in chat_server.requests[0] and "response_format" not in chat_server.requests[1]
    read_request(ODD, llm)                                   # remembered: no JSON mode asked again
    assert "response_format" not in chat_server.requests[2]


def test_the_model_may_refuse_or_describe_an_op_outside_the_catalog(chat_server):
    chat_server.reply = json.dumps({"refuse": "which tensor is 'my thing'?"})
    result, custom = read_request("do my thing", _model(chat_server))
    assert not result.ok and custom is None and result.message.endswith("could not read it either: which tensor is 'my thing'?")
    chat_server.reply = json.dumps({"custom": {
        "name": "mish_squared", "reference": "def reference(x):\n    return x * torch.tanh(torch.nn.functional.softplus(x)) ** 2",
        "inputs": [{"shape": [64, 256], "dtype": "float32"}]}})
    result, custom = read_request("a custom activation x * tanh(softplus(x)) ** 2 on 64x256", _model(chat_server))
    assert not result.ok and custom.name == "mish_squared" and custom.inputs == [{"shape": [64, 256], "dtype": "float32"}]
    assert "outside the catalog" in result.message


@pytest.mark.parametrize("text, dims", [("8 batches of 64x128 times 128x96", {"B": 8, "M": 64, "K": 128, "N": 96}),
                                        ("relu on 1,000,000 float32 elements", {"M": 1, "N": 1000000})])
def test_the_two_misread_phrasings_come_out_right_with_a_model_too_without_asking_it(chat_server, text, dims):
    result, _ = read_request(text, _model(chat_server))
    assert result.spec.dims == dims and chat_server.requests == []


def test_a_run_in_words_is_served_from_the_models_reading_and_its_history_keeps_the_calls(chat_server):
    from mtmc.agents.context import Context
    from mtmc.agents.runner import run_request
    from mtmc.memory import Store
    chat_server.reply = json.dumps({**SOFTMAX, "dims": {"M": 16, "N": 64}, "dtype": "float32"})
    events = []
    state = run_request(ODD.replace("64 rows", "16 rows").replace("half ", ""),
                        Context(target="h200", max_steps=0, llm=_model(chat_server)), on_event=events.append)
    assert state["status"] == "done", state.get("message")
    parsed = next(e for e in events if e["event"] == "parsed")
    assert parsed["assumptions"][0].startswith("read by the model at")
    assert [c["role"] for c in state["llm_calls"]] == ["parser"] and state["llm_calls"][0]["ok"]
    assert Store().get(state["history_id"]).llm_calls == state["llm_calls"]


def test_the_other_reading_is_kept_and_a_follow_up_runs_it(chat_server, tmp_path):
    """The model's reading ran; "use the rules' reading" runs the rules' instead, and the next
    run of the same thread does not inherit the first one's alternative."""
    from mtmc.agents.context import Context
    from mtmc.agents.runner import run_request
    from mtmc.ui.followup import interpret
    chat_server.reply = json.dumps({"family": "elementwise", "op": "chain", "dims": {"M": 16, "N": 16},
                                    "dtype": "float32", "params": {"chain": [{"op": "mul"}]}})
    ctx = Context(target="h200", max_steps=0, llm=_model(chat_server), out_path=str(tmp_path / "k.py"))
    first = run_request("16x16 times 16x16", ctx, thread_id="t-reading")
    assert first["spec"]["family"] == "elementwise" and first["alternative"]["family"] == "matmul"
    follow = interpret("no, use the rules' reading", first["spec"], first["alternative"])
    assert follow.kind == "reading" and follow.spec["family"] == "matmul" and "matmul" in follow.changes[0]
    second = run_request("no, use the rules' reading", ctx, thread_id="t-reading", spec=follow.spec)
    assert second["status"] == "done" and second["spec"]["family"] == "matmul" and second["alternative"] is None
    assert interpret("the other reading please", second["spec"], second["alternative"]).kind == "unclear"
    assert interpret("use bf16", second["spec"], second["alternative"]).kind == "change"   # either reading can change
