"""The launch-overhead action (module.graph_replay): ModelNew's forward replayed as one CUDA graph.
On the CPU the written ModelNew runs its plain forward (checked against Model), and the replay
logic is driven with a stand-in capture that keeps CUDA graph semantics: a graph reads and writes
fixed buffers, so inputs must be copied in, outputs cloned out, and the warm-up's state undone."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from kernel_helpers import template_kernels
from mtmc.module.assemble import assemble
from mtmc.module.capture import capture
from mtmc.module.fusion import partition
from mtmc.module.graph_replay import replay
from mtmc.tools.loader import load_file

MODULES = Path(__file__).parent / "modules"


def test_a_replaying_modelnew_is_written_and_runs_plain_without_a_gpu(tmp_path):
    path = MODULES / "mlp_gelu.py"
    cap = capture(str(path))
    part = partition(cap)
    text = assemble(path.read_text(), cap, part.groups, template_kernels(part.groups), replay=True)
    assert "_mtmc_replay(self, _mtmc_forward_root, args)" in text and "def _mtmc_capture(" in text
    out = tmp_path / "new_replay.py"
    out.write_text(text)
    m = load_file(out, "replay_mlp")
    torch.manual_seed(0)
    model, new = m.Model(*m.get_init_inputs()), m.ModelNew(*m.get_init_inputs())
    new.load_state_dict(model.state_dict())
    x = m.get_inputs()
    with torch.no_grad():
        torch.testing.assert_close(new(*x), model(*x), rtol=1e-4, atol=1e-4)
    # a module with no rewritten root graph replays Model's own forward
    plain = assemble(path.read_text(), cap, part.groups, {}, replay=True)
    assert "_mtmc_replay(self, Model.forward, args)" in plain


class _Graph:
    """CUDA graph semantics on the CPU: replay() reruns the recorded call on the static inputs and
    writes its results into the static outputs (the same tensors every time)."""

    def __init__(self, mod, fn, static_in, static_out):
        self.mod, self.fn, self.static_in, self.static_out = mod, fn, static_in, static_out

    def replay(self):
        self.static_out.copy_(self.fn(self.mod, *self.static_in))


def _capture_counting(counter: list):
    def capture_(mod, fn, args):
        counter.append([tuple(a.shape) for a in args])
        saved = [b.detach().clone() for b in mod.buffers()]
        static_in = [a.clone() for a in args]
        with torch.no_grad():
            static_out = fn(mod, *static_in)   # the warm-up and capture (as the real one does) ...
            for b, v in zip(mod.buffers(), saved):
                b.copy_(v)                      # ... whose state changes are undone
        return _Graph(mod, fn, static_in, static_out), static_in, static_out
    return capture_


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.bn = nn.BatchNorm1d(4)   # training mode: every call moves the running statistics

    def forward(self, x):
        return torch.relu(self.bn(self.fc(x)))


def test_replay_copies_inputs_clones_outputs_and_moves_the_state_once_per_call():
    torch.manual_seed(0)
    ref, net = _Net(), _Net()
    net.load_state_dict(ref.state_dict())
    fn = type(net).forward
    captures = []
    cap = _capture_counting(captures)
    a, b = torch.randn(5, 6), torch.randn(5, 6)
    with torch.no_grad():
        out_a = replay(net, fn, (a,), capture=cap)
        out_b = replay(net, fn, (b,), capture=cap)   # the same signature: replayed, not captured again
        want_a, want_b = ref(a), ref(b)
    torch.testing.assert_close(out_a, want_a)
    torch.testing.assert_close(out_b, want_b)        # outputs follow new inputs (no cached result)
    assert not torch.equal(out_a, out_b)             # and the first output was not overwritten
    assert captures == [[(5, 6)]]
    torch.testing.assert_close(net.bn.running_mean, ref.bn.running_mean)   # two calls, two updates
    assert int(net.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == 2
    with torch.no_grad():
        replay(net, fn, (torch.randn(3, 6),), capture=cap)   # a new batch size: a new graph
        net.eval()
        replay(net, fn, (a,), capture=cap)                   # a new mode: a new graph
    assert len(captures) == 3


def test_what_cannot_be_captured_runs_plainly():
    net = _Net().eval()
    x = torch.randn(4, 6)
    with torch.no_grad():
        got = replay(net, type(net).forward, (x,), capture=lambda mod, fn, args: False)
        torch.testing.assert_close(got, net(x))
        # keyword arguments and CPU tensors (no capture given) never reach a capture
        torch.testing.assert_close(replay(net, type(net).forward, (x,)), net(x))


def _choice(tmp_path, monkeypatch, plain_ms, replay_ms, check="passed", captured=True):
    """replay_choice with the GPU's answers given: the timing job's and the guard's."""
    from types import SimpleNamespace
    from mtmc.agents import module_steps
    upload = tmp_path / "m.py"
    upload.write_text("# upload\n")
    out = tmp_path / "new.py"
    out.write_text("plain")
    monkeypatch.setattr(module_steps, "assemble", lambda *a, replay=False, **k: "replayed" if replay else "plain")
    monkeypatch.setattr(module_steps, "run_job", lambda job, **k: {
        "status": "ok", "result": {"plain_ms": plain_ms, "replay_ms": replay_ms, "captured": captured}})
    monkeypatch.setattr(module_steps, "reference_run", lambda *a, **k: {"status": "ref"})
    monkeypatch.setattr(module_steps, "check_in_child", lambda path, ref, t, **k: {"status": check, "reason": "r"})
    groups = [SimpleNamespace(id=0)]
    outcomes = {0: {"status": "kernel", "source": "", "config": {}, "correctness": {}}}
    d = module_steps.replay_choice(str(upload), {}, groups, outcomes, out, 10)
    assert not (tmp_path / "new_replay.py").exists()   # the candidate file never stays behind
    return d, out.read_text()


def test_the_replayed_modelnew_is_kept_only_when_faster_and_checked(tmp_path, monkeypatch):
    d, text = _choice(tmp_path, monkeypatch, plain_ms=1.0, replay_ms=0.4)
    assert d["status"] == "applied" and text == "replayed" and "2.50x" in d["why"]
    d, text = _choice(tmp_path, monkeypatch, plain_ms=1.0, replay_ms=0.95)
    assert d["status"] == "not applied" and text == "plain" and "launches are not where" in d["why"]
    d, text = _choice(tmp_path, monkeypatch, plain_ms=1.0, replay_ms=0.4, check="failed")
    assert d["status"] == "refused" and text == "plain" and "module check" in d["why"]
    d, text = _choice(tmp_path, monkeypatch, plain_ms=1.0, replay_ms=1.0, captured=False)
    assert d["status"] == "not applied" and "could not be captured" in d["why"]


def _group(i: int) -> dict:
    from mtmc.kernels.spec import KernelSpec
    return {"id": i, "spec": KernelSpec("elementwise", "chain", {"M": i + 1, "N": 8}).to_dict()}


def test_replay_is_refused_for_random_forwards_and_tried_only_where_launches_weigh():
    from mtmc.agents.module_flow import _replay_refusal
    node = {"name": "drop", "op": "call_function", "target": "torch.nn.functional.dropout", "args": [], "kwargs": {}}
    state = {"gpu": True, "check": {"status": "passed"}, "memory": {"inputs_bytes": 1000},
             "captured": {"graphs": [{"nodes": [node], "modules": {}}]}}
    status, why = _replay_refusal(state)
    assert status == "refused" and "random" in why
    state["captured"]["graphs"][0]["nodes"] = []
    assert _replay_refusal(state) is None
    assert _replay_refusal({**state, "gpu": False})[0] == "not tried"
    status, why = _replay_refusal(state, enabled=False)   # off unless optimize --cuda-graph asks for it
    assert status == "not tried" and "--cuda-graph" in why
    big = {**state, "memory": {"inputs_bytes": 4 << 30}}
    assert _replay_refusal(big)[0] == "refused"
    # one 5 ms kernel: a launch is nothing beside it; forty 20 us groups: launches are half the time
    one = {**state, "groups": [_group(0)], "outcomes": {"0": {"status": "kernel", "time_ms": 5.0}}}
    status, why = _replay_refusal(one)
    assert status == "not tried" and "launches are not where" in why
    many = {**state, "groups": [_group(i) for i in range(40)],
            "outcomes": {str(i): {"status": "kernel", "time_ms": 0.02} for i in range(40)}}
    assert _replay_refusal(many) is None


def test_why_a_cuda_graph_is_answered_from_the_modules_record():
    from mtmc.ui.followup import interpret
    from mtmc.ui.module_view import fusion_answer
    q = "why did you replay it as a CUDA graph?"
    assert interpret(q, None).fusion
    summary = {"file": "m.py", "groups": [], "torch_ops": [],
               "replay": {"action": "cuda_graph", "status": "applied", "why": "replayed 0.4 ms against 1.0 ms plain",
                          "plain_ms": 1.0, "replay_ms": 0.4}}
    answer = fusion_answer(q, summary)
    assert "CUDA graph replay of the whole forward" in answer and "applied" in answer and "1.0000 ms" in answer


def test_the_guards_launch_counter_counts_what_a_graph_replay_launches():
    """The guard's own_kernels check counts Triton launches per call: a replayed graph makes none
    from Python, so the launches recorded while the graph was captured count on every replay."""
    from types import SimpleNamespace
    from mtmc.tools.guard.probes import LaunchCounter
    counter = LaunchCounter()
    run = counter._wrap(lambda kernel, *a, **k: None)
    kernel = SimpleNamespace(fn=SimpleNamespace(__name__="fused_kernel"))
    graph = SimpleNamespace()
    run(kernel)                         # a plain launch: counted
    counter.begin_capture(graph)
    run(kernel)
    run(kernel)                         # recorded by the capture, which runs nothing
    counter.end_capture(graph)
    assert counter.names == {"fused_kernel": 1}
    counter.replayed(graph)
    counter.replayed(graph)
    assert counter.names == {"fused_kernel": 5}
    counter.replayed(SimpleNamespace())   # a graph captured before the counter: nothing known
    assert counter.count == 5
