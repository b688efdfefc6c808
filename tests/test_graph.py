"""The whole LangGraph loop, end to end, on this machine: real templates, real child-process
verification (Triton's interpreter + an sm_90 compile), a real SQLite checkpointer."""
import json
import os
import subprocess
import sys

import pytest

from mtmc.agents.context import Context
from mtmc.agents.graph import checkpointer, compile_graph
from mtmc.agents.runner import run_request
from mtmc.policy import baseline, learned

TEN_REQUESTS = [
    "Write a fused softmax over the rows of a 4096x8192 fp16 tensor",
    "log softmax along the last dim of a (2048, 1000) float32 tensor",
    "rmsnorm on 8192 rows of width 4096",
    "layer norm of a [16, 128, 768] bf16 activation",
    "sum each row of a 1000x3000 matrix",
    "argmax over the rows of a 512x32000 half tensor",
    "apply gelu to a 4096x4096 fp16 tensor",
    "add a bias, then silu, then scale by 0.5 on a 2048x5120 bf16 tensor",
    "batched matmul 32x512x512 by 32x512x1024 in bf16 with a relu",
    "linear layer with 1024 inputs and 4096 outputs on a batch of 512 tokens with bias, fp16",
]


def _run(request, **kw):
    events = []
    run_kw = kw.pop("run_kw", {})
    ctx = Context(target="h200", max_steps=kw.pop("max_steps", 2), **kw)
    state = run_request(request, ctx, on_event=events.append, **run_kw)
    return state, events


def test_softmax_request_runs_the_whole_loop(tmp_path):
    out = tmp_path / "softmax.py"
    state, events = _run("softmax over the rows of a 4096x8192 fp16 tensor", out_path=str(out), max_steps=3)
    assert state["status"] == "done", state.get("message")
    kinds = [e["event"] for e in events]
    for k in ("parsed", "retrieved", "code", "verify", "plan", "final"):
        assert k in kinds
    steps = state["steps"]
    assert steps[0]["origin"] == "template" and steps[0]["verdict"]["ok"]
    for s in steps:  # every step is recorded with its action, reason and verdict
        assert s["action"] and s["reason"] and "verdict" in s and s["outcome"]
    planner_steps = [s for s in steps if s["origin"] == "planner"]
    # the shipped checkpoint plans the families it was trained on; the baseline the others
    loaded = learned.load_policy()
    trained = loaded is not None and "softmax" in loaded.meta.get("families", [])
    for s in planner_steps:
        assert s["alternatives"] and abs(sum(a["prob"] for a in s["alternatives"])) <= 1.0001
        assert s["policy"] == (loaded.name if trained else baseline.POLICY_NAME)
        assert s["diff"].startswith("--- before.py")
    best = state["best"]["verdict"]
    assert best["measured"] is False and "estimate" in best["timing"]["label"]
    assert best["resources"]["kernels"][0]["regs"] > 0  # compiled for sm_90 without a GPU
    assert out.exists()


def test_kernel_file_checks_itself(tmp_path):
    out = tmp_path / "rms.py"
    state, _ = _run("rmsnorm on 300 rows of width 1000 in fp32", out_path=str(out), max_steps=0)
    assert state["status"] == "done"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the file decides itself
    proc = subprocess.run([sys.executable, str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("PASS") == 3


def test_kernel_file_fails_when_the_kernel_is_wrong(tmp_path):
    out = tmp_path / "sum.py"
    state, _ = _run("row sum of a 64x500 fp32 tensor", out_path=str(out), max_steps=0)
    src = out.read_text()
    # Sabotage the launch: it now writes nothing, so the NaN-poisoned output must fail.
    marker = "# ---- PyTorch reference"
    assert marker in src
    out.write_text(src.replace(marker, "def launch(*inputs, out):\n    pass\n\n\n" + marker, 1))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0 and "FAIL" in proc.stdout


def test_unsupported_request_gets_a_clear_answer():
    state, events = _run("write me a 3x3 convolution over a 224x224 image")
    assert state["status"] == "unsupported"
    assert "softmax" in state["message"].lower() and "matmul" in state["message"].lower()


def test_checkpointer_keeps_the_thread(tmp_path):
    ctx = Context(target="h200", max_steps=1)
    state = run_request("relu on a 1000x1000 fp32 tensor", ctx, thread_id="t-1")
    assert state["status"] == "done"
    # A new saver on the same file (a new process would see the same) finds the finished thread.
    graph = compile_graph(checkpointer())
    snap = graph.get_state({"configurable": {"thread_id": "t-1"}})
    assert snap.values["status"] == "done" and snap.values["steps"] == state["steps"]


def test_planted_shared_memory_overflow_is_repaired():
    spec = {"family": "matmul", "op": "matmul", "dims": {"M": 512, "N": 512, "K": 512}, "dtype": "float16",
            "params": {}, "request": "planted overflow"}
    planted = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1,
               "PERSISTENT": False, "num_warps": 8, "num_stages": 5}
    state, events = _run("", max_steps=0, run_kw={"spec": spec, "initial_config": planted})
    first = state["steps"][0]
    assert first["verdict"]["kind"] == "smem_overflow" and first["verdict"]["stage"] == "compile"
    assert any(e["event"] == "debug" and e.get("fix") for e in events)
    assert state["status"] == "done"
    fixed = state["best"]["verdict"]["resources"]["kernels"][0]
    assert fixed["shared_bytes"] <= 232448


def test_planted_register_spills_are_repaired():
    spec = {"family": "matmul", "op": "matmul", "dims": {"M": 256, "N": 256, "K": 256}, "dtype": "float32",
            "params": {}, "request": "planted spills"}
    planted = {"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 1, "SPLIT_K": 1,
               "PERSISTENT": False, "num_warps": 2, "num_stages": 2}
    state, events = _run("", max_steps=0, max_debug=4, run_kw={"spec": spec, "initial_config": planted})
    first = state["steps"][0]
    assert first["verdict"]["kind"] in ("register_spills", "too_many_regs")
    assert state["status"] == "done"
    assert all(k.get("spill_bytes", 0) == 0 for k in state["best"]["verdict"]["resources"]["kernels"])


@pytest.mark.parametrize("request_text", TEN_REQUESTS)
def test_cli_generate_serves_differently_worded_requests(request_text, tmp_path):
    out = tmp_path / "k.py"
    proc = subprocess.run([sys.executable, "-m", "mtmc.commands.cli", "generate", request_text, "--out", str(out),
                           "--target", "h200", "--max-steps", "1", "--json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["status"] == "done" and summary["final_config"] and out.exists()
    assert summary["steps"][0]["verdict"]["ok"]


def test_cli_rejects_what_it_cannot_serve(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mtmc.commands.cli", "generate", "sort a list of strings",
                           "--out", str(tmp_path / "x.py")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "support" in (proc.stdout + proc.stderr).lower()
    assert not (tmp_path / "x.py").exists()
