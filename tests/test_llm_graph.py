"""The LLM coder as a branch of the agent graph (issue 18): words outside the catalog go from the
parser role's reference to a guarded kernel over the planner's macro moves, with the debugger role
fixing rejected drafts, through the loopback `chat_server` and the real ChatOpenAI client."""
import json

from mtmc.agents.context import Context
from mtmc.agents.explainer import explain
from mtmc.agents.llm_debugger import knob_fix
from mtmc.agents.runner import run_request
from mtmc.request.parse import parse_request
from mtmc.tools import llm as chat_model
from test_llm_coder import CHEAT, PARSED, WORDS, kernel


def _ctx(llm, tmp_path, **kw) -> Context:
    return Context(target="h200", max_steps=3, max_debug=1, use_gpu=False, timeout_s=120,
                   out_path=str(tmp_path / "kernel.py"), llm=llm, **kw)


def _outcomes(state):
    return [(s["origin"], (s["action"] or {}).get("value"), s["outcome"].split(" (")[0].split(";")[0])
            for s in state["steps"]]


def test_words_outside_the_catalog_become_a_guarded_kernel_over_macro_steps(chat_server, tmp_path):
    llm = chat_model.build(chat_server.url, "stub-model", timeout_s=10)
    chat_server.script = [("ok", PARSED),                          # parser: the reference
                          ("ok", kernel(256)),                     # first draft: accepted
                          ("ok", CHEAT), ("ok", kernel(512)),      # move "tile": a torch cheat, the debugger's fix
                          ("garbage", ""), ("ok", "no code"),      # move "warps": malformed, then no code: roll back
                          ("ok", kernel(1024, 8))]                 # move "grid": accepted; then every move is made
    events = []
    state = run_request(WORDS, _ctx(llm, tmp_path), on_event=events.append)
    assert state["status"] == "done", state["message"]
    assert _outcomes(state) == [
        ("llm-coder", None, "accepted by the guard"),
        ("planner", "tile", "failed"), ("debugger", "rewrite", "accepted by the guard"),
        ("planner", "warps", "failed"), ("debugger", "ask_again", "failed"),
        ("planner", "grid", "accepted by the guard")], state["steps"]
    assert "own_kernels" in state["steps"][1]["verdict"]["kind"] + state["steps"][1]["outcome"]
    assert "rolled back to step 2" in state["steps"][4]["outcome"]
    written = (tmp_path / "kernel.py").read_text()
    assert "BLOCK=1024" in written and "class ModelNew" in written and "def reference(" in written
    assert state["decision"]["action"]["kind"] == "stop"
    # each move's instruction came from the planner, with the hardware facts; fixes saw the verdict
    assert "132 SMs" in chat_server.prompt(2) and "BLOCK size" in chat_server.prompt(2)
    assert "The verifier rejected this draft" in chat_server.prompt(3)
    assert "132" in chat_server.prompt(6) and "grid-stride" in chat_server.prompt(6)
    roles = [c["role"] for c in state["llm_calls"]]
    assert roles == ["parser", "coder", "coder", "debugger", "coder", "coder", "coder"], roles
    guarded = [e for e in events if e["event"] == "verify" and e["verdict"]["stage"] == "guard"]
    assert len(guarded) == 4                                       # replies without code never reach the guard
    why = explain("why step 1?", state)
    assert "move=tile" in why and "BLOCK size" in why and "own_kernels" in why
    assert "stop" in explain("why did it stop?", state).lower()


def test_without_an_endpoint_the_custom_op_is_refused_as_before(tmp_path):
    state = run_request(WORDS, _ctx(None, tmp_path))
    assert state["status"] == "unsupported" and state["message"] == parse_request(WORDS).message
    assert not state.get("custom") and not (tmp_path / "kernel.py").exists()


def test_a_dead_endpoint_is_reported_not_raised(chat_server, tmp_path):
    llm = chat_model.build(chat_server.url, "stub-model", timeout_s=2)
    chat_server.close()
    state = run_request(WORDS, _ctx(llm, tmp_path))
    assert state["status"] == "unsupported" and "connection refused" in state["message"]


def test_an_endpoint_that_dies_mid_run_keeps_the_last_accepted_draft(chat_server, tmp_path):
    llm = chat_model.build(chat_server.url, "stub-model", timeout_s=5)
    chat_server.script = [("ok", PARSED), ("ok", kernel(256))]
    chat_server.mode = "status"                                    # then HTTP 500 for every call
    state = run_request(WORDS, _ctx(llm, tmp_path))
    assert state["status"] == "done" and "step 0" in state["message"]
    assert "BLOCK=256" in (tmp_path / "kernel.py").read_text()
    assert all("rolled back to step 0" in s["outcome"] for s in state["steps"] if s["origin"] == "debugger")
    assert any("HTTP 500" in (c.get("error") or "") for c in state["llm_calls"])


def test_a_first_draft_never_accepted_leaves_the_op_unserved(chat_server, tmp_path):
    llm = chat_model.build(chat_server.url, "stub-model", timeout_s=5)
    chat_server.script = [("ok", PARSED), ("ok", CHEAT), ("ok", CHEAT)]
    state = run_request(WORDS, _ctx(llm, tmp_path))
    assert state["status"] == "failed" and "passed the guard" in state["message"]
    assert "no correct draft to fall back to" in state["steps"][-1]["outcome"]


def test_the_debugger_role_picks_a_legal_knob_move_for_a_template_draft(chat_server):
    llm = chat_model.build(chat_server.url, "stub-model", timeout_s=5)
    chat_server.script = [("ok", json.dumps({"knob": "BLOCK", "value": 4096})),          # not legal: asked again
                          ("ok", json.dumps({"knob": "num_warps", "value": 8, "why": "fewer registers"}))]
    calls = []
    verdict = {"ok": False, "stage": "compile", "kind": "compile_error", "detail": "out of resources: shared memory"}
    action, why = knob_fix(llm, {"BLOCK": [256, 512], "num_warps": [4, 8]}, {"BLOCK": 512, "num_warps": 4},
                           verdict, set(), "Target: H200", calls)
    assert (action.knob, action.value, why) == ("num_warps", 8, "fewer registers")
    assert "out of resources" in chat_server.prompt(0) and "not a legal untried move" in chat_server.prompt(1)
    assert [c["ok"] for c in calls] == [False, True]
