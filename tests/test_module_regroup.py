"""regroup: a conv or matmul group whose kernel lost to PyTorch keeps its anchor in cuDNN /
cuBLAS and its tail becomes a fused group of its own (on the H100, 2026-12-05, L2
1_Conv2D_ReLU_BiasAdd's whole group fell back and ran at 0.45x of torch.compile, which runs cuDNN
plus one fused tail).  On the CPU every kernel wins, so the GPU's verdict is stood in for."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtmc.agents import module_flow, module_steps
from mtmc.agents.context import Context
from mtmc.module.capture import capture
from mtmc.module.fusion import Group, Partition, partition
from test_module_conv import assert_model_new_matches

MODULES = Path(__file__).parent / "modules"
LOST = "its best kernel (5.0976 ms) loses to PyTorch eager (4.3880 ms) on the GPU"


def planned(name: str) -> dict:
    cap = capture(str(MODULES / name))
    part = partition(cap)
    return {"captured": cap, "groups": [g.to_dict() for g in part.groups], "torch_ops": part.torch_ops,
            "gpu": False}


def lost(state: dict, family: str) -> dict:
    return {str(g["id"]): ({"status": "fallback", "reason": LOST} if g["family"] == family
                           else {"status": "kernel"}) for g in state["groups"]}


def test_a_lost_conv_keeps_cudnn_and_its_tail_is_fused_on_its_own(tmp_path):
    state = planned("conv_bias_act.py")
    (conv,) = state["groups"]
    state["outcomes"] = lost(state, "conv")
    out = module_flow.regroup(state)
    (tail,) = [Group.from_dict(g) for g in out["groups"]]
    assert tail.id == conv["id"] + 1 and tail.family == "elementwise"
    assert [s["op"] for s in tail.spec["params"]["chain"]] == ["add", "scale", "leaky_relu", "tanh"]
    (kept,) = out["torch_ops"]
    assert "conv" in kept["op"].lower() and "library kernel" in kept["why"] and LOST in kept["why"]
    assert out["library"] == [{"graph": "", "group": conv["id"], "ops": conv["ops"], "why": kept["why"]}]
    # only the new group is sent; after it ran, the flow goes on to assemble, and never splits twice
    state.update(out)
    assert [s.arg["group"]["id"] for s in module_flow.fan_out_regrouped(state)] == [tail.id]
    state["outcomes"][str(tail.id)] = {"status": "kernel"}
    assert module_flow.fan_out_regrouped(state) == "assemble" and module_flow.regroup(state) == {}
    # ModelNew: cuDNN's conv, then the tail's Triton kernel: Model's outputs
    source = (MODULES / "conv_bias_act.py").read_text()
    assert_model_new_matches(tmp_path, source, state["captured"], Partition([tail], []))
    text = (tmp_path / "new_model.py").read_text()
    assert "_mtmc_g1_" in text and "_mtmc_g0_" not in text


def test_groups_that_won_or_have_no_tail_are_left_alone():
    state = planned("conv_bias_act.py")
    state["outcomes"] = {str(g["id"]): {"status": "kernel"} for g in state["groups"]}
    assert module_flow.regroup(state) == {"library": [], "outcomes": {}}
    assert module_flow.fan_out_regrouped({**state, "library": []}) == "assemble"
    # conv_block: a lone conv2d (group 1) lost, the two convs with tails won: nothing to split
    block = planned("conv_block.py")
    assert [len(g["ops"]) for g in block["groups"]] == [3, 1, 3]
    block["outcomes"] = {"0": {"status": "kernel"}, "1": {"status": "fallback", "reason": LOST},
                         "2": {"status": "kernel"}}
    assert module_flow.regroup(block) == {"library": [], "outcomes": {}}
    # the transposed conv lost too: only it is split, groups 0 and 1 keep their ids and outcomes
    block["outcomes"]["2"] = {"status": "fallback", "reason": LOST}
    out = module_flow.regroup(block)
    assert [g["id"] for g in out["groups"]] == [0, 1, 3] and out["groups"][:2] == block["groups"][:2]
    assert [e["group"] for e in out["library"]] == [2]


def test_a_lost_linear_keeps_cublas_and_its_activation_is_fused(tmp_path):
    state = planned("linear_bias_relu.py")
    matmuls = [g for g in state["groups"] if g["family"] == "matmul" and len(g["ops"]) > 1]
    assert matmuls
    state["outcomes"] = lost(state, "matmul")
    out = module_flow.regroup(state)
    new = [Group.from_dict(g) for g in out["groups"] if g["id"] > max(x["id"] for x in state["groups"])]
    assert new and all(g.family != "matmul" for g in new)
    assert any("library kernel" in t["why"] for t in out["torch_ops"])


@pytest.mark.slow
def test_the_module_flow_splits_a_lost_conv_and_the_guard_passes_it(tmp_path, monkeypatch):
    """The whole flow (capture, groups, regroup, second fan-out, assemble, the guard) with the
    conv group's GPU verdict stood in for by a loss."""
    real = module_steps.outcome_from_state

    def conv_loses(final, gpu):
        o = real(final, gpu)
        if (final.get("spec") or {}).get("family") == "conv":
            o = {**o, "status": "fallback", "reason": LOST}
        return o
    monkeypatch.setattr(module_steps, "outcome_from_state", conv_loses)
    summary = module_flow.optimize_module(str(MODULES / "conv_bias_act.py"), Context(target="h200", max_steps=0),
                                          str(tmp_path / "new.py"), str(tmp_path / "report.md"))
    assert summary["status"] == "done" and summary["check"]["status"] == "passed", summary["check"]
    (g,) = summary["groups"]
    assert g["family"] == "elementwise" and g["status"] == "kernel"
    assert any("library kernel" in t["why"] for t in summary["torch_ops"])
    assert "library kernel" in (tmp_path / "report.md").read_text()


# L2 1's and L2 57's convs as tools.layout_probe measured them on the H100 (2026-12-06)
PAYS = {"nchw_ms": 2.803, "cl_ms": 2.296, "nchw_err": 3.1e-4, "cl_err": 3.1e-4, "gpu": "NVIDIA H100 80GB HBM3"}
TF32_ONLY_CHANNELS_LAST = {"nchw_ms": 1.099, "cl_ms": 0.879, "nchw_err": 4.6e-7, "cl_err": 3.0e-4, "gpu": "H100"}


def test_on_a_gpu_the_library_conv_runs_channels_last_with_its_tail_reading_that_layout(tmp_path, monkeypatch):
    """Where cuDNN runs the conv faster channels-last at the same precision (measured on this GPU:
    tools.layout_probe), the tail then reads [N, H, W, C] with the per-channel bias as a [C]
    vector, and the result keeps channels-last strides (nothing converts it back)."""
    probed = []
    monkeypatch.setattr(module_steps, "measure_layout", lambda desc, conv: probed.append(conv) or PAYS)
    state = {**planned("conv_bias_act.py"), "gpu": True}
    state["outcomes"] = lost(state, "conv")
    out = module_flow.regroup(state)
    assert probed == ["conv"]
    (tail,) = [Group.from_dict(g) for g in out["groups"]]
    assert tail.family == "elementwise" and tail.spec["dims"] == {"M": 2 * 8 * 8, "N": 8}   # rows of C
    assert tail.spec["params"]["chain"][0] == {"op": "bias"}
    (applied,) = out["rewrites"]["applied"]
    assert applied["rule"] == "channels_last" and applied["measured"] == PAYS
    assert applied["reason"].startswith("cuDNN runs this conv 1.22x faster channels-last at the same precision")
    targets = [(n["target"], n["kwargs"]) for n in out["captured"]["graphs"][0]["nodes"]]
    assert ("contiguous", {"dict": {"memory_format": {"torch": "channels_last"}}}) in targets
    assert out["original_graphs"] == state["captured"]["graphs"]   # the guard's fallback
    source = (MODULES / "conv_bias_act.py").read_text()
    assert_model_new_matches(tmp_path, source, out["captured"], Partition([tail], []))


@pytest.mark.parametrize("forward, why", [
    ("y = self.conv(x)\nreturn torch.relu(y) + y.mean()", "leaves its pointwise tail"),
    ("return F.group_norm(torch.relu(self.conv(x)), 2)", "a later group reads it contiguous"),
    ("return self.conv(x).sum(dim=1)", "no pointwise op follows"),
    ("return torch.relu(self.conv(x)) + x[:, :1, 1:-1, 1:-1]", "not per-channel"),
    # a size read of a tail value would read the channels-last shape
    ("y = torch.relu(self.conv(x))\nreturn y * 2.0, y.size(1)", "leaves its pointwise tail"),
])
def test_channels_last_is_refused_where_the_layout_would_be_converted_back(tmp_path, forward, why):
    from mtmc.module.graph_stage.layout import channels_last
    path = tmp_path / "m.py"
    path.write_text("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
                    "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                    "        self.conv = nn.Conv2d(4, 4, 3)\n\n    def forward(self, x):\n"
                    + "".join(f"        {line}\n" for line in forward.splitlines())
                    + "\n\ndef get_inputs():\n    return [torch.randn(2, 4, 6, 6)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    c = channels_last(capture(str(path))["graphs"][0], "conv")
    assert not c.legal and why in c.reason, c.reason


@pytest.mark.parametrize("conv, x, bias, forward, family", [
    ("nn.Conv3d(3, 4, 3)", "torch.randn(2, 3, 5, 6, 5)", "torch.randn(4, 1, 1, 1)",
     "y = self.conv(x)\nreturn torch.sigmoid(y) * y + self.b", "elementwise"),
    ("nn.ConvTranspose2d(3, 4, 3, stride=2)", "torch.randn(2, 3, 4, 5)", "torch.randn(4)",
     "return torch.tanh(self.conv(x) - self.b.view(1, 4, 1, 1)) * 2.0", "elementwise"),
    # KernelBench L2 93: `.device` reads no layout, so the tail is still one pointwise chain
    ("nn.ConvTranspose2d(3, 4, 3, stride=2)", "torch.randn(2, 3, 4, 5)", "torch.randn(4)",
     "y = self.conv(x) + 0.5\ny = torch.min(y, torch.tensor(0.0, device=y.device))\n"
     "return torch.nn.functional.gelu(y) * 2.0", "elementwise"),
    # KernelBench L2 91 / 49: a softmax over the channels is a row softmax channels-last
    ("nn.ConvTranspose2d(3, 4, 3, stride=2)", "torch.randn(2, 3, 4, 5)", "torch.randn(4, 1, 1)",
     "y = torch.softmax(self.conv(x), dim=1)\nreturn torch.sigmoid((y + self.b) * 2.0)", "softmax"),
    ("nn.Conv3d(3, 4, 3)", "torch.randn(2, 3, 5, 6, 5)", "torch.randn(1)",
     "return torch.sigmoid(torch.nn.functional.log_softmax(self.conv(x), 1))", "softmax"),
], ids=["conv3d-swish", "conv_transpose2d", "constant-on-the-device", "channel-softmax", "channel-log-softmax-3d"])
def test_channels_last_islands_of_3d_and_transposed_convs_match_model(tmp_path, conv, x, bias, forward, family):
    from mtmc.module.graph_stage.layout import channels_last
    path = tmp_path / "m.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
                    f"        super().__init__()\n        self.conv = {conv}\n        self.b = nn.Parameter({bias})\n\n"
                    "    def forward(self, x):\n" + "".join(f"        {line}\n" for line in forward.splitlines())
                    + f"\n\ndef get_inputs():\n    return [{x}]\n\n\ndef get_init_inputs():\n    return []\n")
    cap = capture(str(path))
    c = channels_last(cap["graphs"][0], "conv")
    assert c.legal, c.reason
    new = {**cap, "graphs": [c.apply]}
    part = partition(new, library={"": {"conv": "kept in cuDNN"}})
    assert [g.family for g in part.groups] == [family]
    assert_model_new_matches(tmp_path, path.read_text(), new, part)


@pytest.mark.parametrize("measured, why", [
    (TF32_ONLY_CHANNELS_LAST, "cuDNN rounds this conv to TF32 channels-last but not as given"),
    ({**PAYS, "cl_ms": 2.70}, "cuDNN is not faster channels-last here"),
    ({"error": "the layout probe failed: timed_out"}, "not measured: the layout probe failed"),
], ids=["tf32-only-channels-last", "not-faster", "probe-failed"])
def test_the_island_is_refused_where_the_measurement_says_it_does_not_pay(monkeypatch, measured, why):
    """L2 57 on the H100: cuDNN ran its conv in fp32 as given and TF32 channels-last, and the island
    failed the guard's fp32 tolerance; measured, it is refused before any kernel is built for it."""
    monkeypatch.setattr(module_steps, "measure_layout", lambda desc, conv: measured)
    state = {**planned("conv_bias_act.py"), "gpu": True}
    state["outcomes"] = lost(state, "conv")
    out = module_flow.regroup(state)
    (refused,) = [r for r in out["rewrites"]["refused"] if r["rule"] == "channels_last"]
    assert refused["reason"].startswith(why) and refused["measured"] == measured
    assert not out["rewrites"]["applied"] and "original_graphs" not in out and "captured" not in out


def test_the_layout_probe_builds_the_captured_conv():
    """The probe rebuilds a module conv from its captured attributes (its own random weights: no
    user code runs in it); on a GPU it times and measures it, here it must give the same shapes."""
    import torch

    from mtmc.tools.layout_probe import build, job_of
    cap = capture(str(MODULES / "conv_bias_act.py"))
    job = job_of(cap["graphs"][0], "conv")
    assert job["kind"] == "layout_probe" and job["input"] == [2, 3, 10, 10] and job["bias"] is False
    conv, x = build(job, "cpu")
    assert isinstance(conv, torch.nn.Conv2d) and conv.bias is None
    conv_node = next(n for n in cap["graphs"][0]["nodes"] if n["name"] == "conv")
    assert list(conv(x).shape) == conv_node["value"]["tensor"]["shape"]


WON = {"status": "kernel", "measured": True, "time_ms": 1.22, "eager_ms": 2.99, "reason": "the catalog serves it"}


@pytest.mark.parametrize("library_ms, pays", [(0.40, True), (1.20, False)])
def test_a_conv_kernel_that_won_still_weighs_cudnn_with_its_tail_fused(monkeypatch, library_ms, pays):
    """L2 57 on the H100: our conv with its tail beat eager (1.22 against 2.99 ms) and so was kept,
    while torch.compile (cuDNN's conv, then one fused tail) ran 0.80 ms.  The library conv's
    measured time plus the tail's estimate is now weighed against our group's measured time."""
    monkeypatch.setattr(module_steps, "measure_layout",
                        lambda desc, conv: {**TF32_ONLY_CHANNELS_LAST, "nchw_ms": library_ms})
    state = {**planned("conv_bias_act.py"), "gpu": True}
    (conv,) = state["groups"]
    state["outcomes"] = {str(conv["id"]): dict(WON)}
    out = module_flow.regroup(state)
    decision = out["outcomes"][str(conv["id"])]["library_decision"]
    assert f"cuDNN's conv {library_ms:.3f} ms (measured)" in decision and "1.220 ms (measured)" in decision
    if not pays:   # ours stays: no split, and the report keeps the numbers it was weighed by
        assert out["library"] == [] and out["outcomes"][str(conv["id"])]["status"] == "kernel"
        assert decision.startswith("our conv kernel stays")
        return
    assert out["outcomes"][str(conv["id"])]["status"] == "fallback"
    assert out["outcomes"][str(conv["id"])]["reason"].startswith("the library conv with a fused tail is faster")
    (tail,) = [Group.from_dict(g) for g in out["groups"]]
    assert tail.family == "elementwise" and [e["group"] for e in out["library"]] == [conv["id"]]


def test_the_library_decision_needs_a_measured_kernel_on_a_gpu(monkeypatch):
    monkeypatch.setattr(module_steps, "measure_layout", lambda desc, conv: pytest.fail("probed off a GPU"))
    state = planned("conv_bias_act.py")   # gpu False
    state["outcomes"] = {str(g["id"]): dict(WON) for g in state["groups"]}
    assert module_flow.regroup(state) == {"library": [], "outcomes": {}}


@pytest.mark.parametrize("ours_ms, eager_ms, status", [(2.020, 2.016, "kernel"), (2.000, 2.016, "kernel"),
                                                         (2.100, 2.016, "fallback")])
def test_a_kernel_at_eagers_time_is_kept_and_a_slower_one_falls_back(ours_ms, eager_ms, status):
    """L1 5 (a scalar multiply, memory-bound) fell back on the H200 with its kernel a hair over
    eager's time: within timing noise the user keeps the Triton kernel they asked for."""
    state = {"status": "done", "baselines": {"eager_ms": eager_ms},
             "best": {"source": "k", "config": {}, "time_ms": ours_ms, "verdict": {"measured": True}}}
    out = module_steps.outcome_from_state(state, gpu=True)
    assert out["status"] == status
    assert (status == "fallback") == ("loses to PyTorch eager" in out["reason"])
