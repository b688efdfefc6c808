"""The planner role with a model (issue 18): the learned policy ranks the legal moves, the model
picks one of them (or stop) and says why; anything else it names leaves the policy's choice.
Through the loopback `chat_server` and the real ChatOpenAI client."""
import json

from mtmc.agents.context import Context
from mtmc.agents.llm_planner import choose
from mtmc.agents.runner import run_request
from mtmc.kernels.catalog import family_of
from mtmc.policy import learned
from mtmc.policy.actions import Action, config_key
from mtmc.request.parse import parse_request
from mtmc.tools import llm as chat_model
from mtmc.tools.hardware import resolve

WORDS = "softmax over the rows of a 64x256 fp16 tensor"


def _decision(max_steps=3):
    spec = parse_request(WORDS).spec
    hw = resolve("h200")
    cfg = family_of(spec).default_config(spec, hw)
    d = learned.decide(spec, cfg, hw, tried={config_key(cfg)}, measured=False, steps_taken=0,
                       max_steps=max_steps, stale_steps=0, patience=3).to_dict()
    return spec, cfg, d


def _other_move(d) -> str:
    own = Action.from_dict(d["action"]).label()
    return next(a["action"] for a in d["alternatives"] if a["kind"] != "stop" and a["action"] != own)


def test_the_model_picks_one_of_the_policys_moves(chat_server):
    llm = chat_model.build(chat_server.url, "stub-model", timeout_s=5)
    spec, cfg, d = _decision()
    pick = _other_move(d)
    chat_server.script = [("ok", json.dumps({"choice": pick, "why": "more rows per program hide latency"}))]
    calls = []
    out = choose(llm, spec, cfg, d, None, "h200", calls)
    assert Action.from_dict(out["action"]).label() == pick and out["chosen_by"] == "model"
    assert "the model's choice" in out["reason"] and "more rows per program" in out["reason"]
    assert out["alternatives"] == d["alternatives"]   # the policy's ranking is kept in the record
    seen = chat_server.prompt(0)
    assert "Ranked legal moves" in seen and all(a["action"] in seen for a in d["alternatives"])
    assert [c["role"] for c in calls] == ["planner"]


def test_a_move_off_the_list_leaves_the_policys_choice(chat_server):
    llm = chat_model.build(chat_server.url, "stub-model", timeout_s=5)
    spec, cfg, d = _decision()
    chat_server.script = [("ok", json.dumps({"choice": "BLOCK_N=3"})), ("ok", "not json at all"),
                          ("ok", json.dumps({"choice": "num_warps=64", "why": "more is better"}))]
    out = choose(llm, spec, cfg, d, None, "h200")
    assert out["action"] == d["action"] and "chosen_by" not in out
    assert "the policy's choice stands" in out["model_note"]
    assert "must be one of the listed moves" in chat_server.prompt(1)


def test_a_dead_endpoint_leaves_the_policys_choice():
    llm = chat_model.build("http://127.0.0.1:9/v1", "stub-model", timeout_s=2)
    spec, cfg, d = _decision()
    out = choose(llm, spec, cfg, d, None, "h200")
    assert out["action"] == d["action"] and "not used" in out["model_note"]


def test_the_models_move_is_the_step_the_graph_takes(chat_server, tmp_path):
    """A whole request: the first draft, then the planner's one move is the model's pick (the
    offline policy alone would stop at step 0 here), coded, verified and recorded."""
    llm = chat_model.build(chat_server.url, "stub-model", timeout_s=5)
    _, _, d = _decision(max_steps=1)
    pick = _other_move(d) if d["action"]["kind"] != "stop" else next(
        a["action"] for a in d["alternatives"] if a["kind"] != "stop")
    chat_server.script = [("ok", json.dumps({"choice": pick, "why": "the scripted pick"}))]
    ctx = Context(target="h200", max_steps=1, use_gpu=False, timeout_s=120, out_path=str(tmp_path / "k.py"),
                  llm=llm)
    state = run_request(WORDS, ctx)
    moved = [s for s in state["steps"] if s.get("origin") == "planner"]
    assert moved and Action.from_dict(moved[0]["action"]).label() == pick, state["steps"]
    assert "the scripted pick" in moved[0]["reason"]
    assert any(c["role"] == "planner" for c in state["llm_calls"])
