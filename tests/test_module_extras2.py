"""torch.where / masked_fill / comparisons and two-tensor formulas in uploaded modules: the groups
they become (one kernel per formula), why near misses stay PyTorch, and that ModelNew with the
default kernels computes what Model does (interpreter, small sizes)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtmc.module.capture import capture
from mtmc.module.fusion import partition
from tests.test_module_conv import assert_model_new_matches

MODULES = Path(__file__).parent / "modules"


@pytest.fixture(scope="module")
def where_forms():
    cap = capture(str(MODULES / "where_forms.py"))
    return (MODULES / "where_forms.py").read_text(), cap, partition(cap)


def _by_line(part) -> dict[int, object]:
    return {int(g.ops[-1].split("(line ")[-1].rstrip(")")): g for g in part.groups}


def test_where_and_masked_fill_are_steps_of_one_kernel(where_forms):
    _, _, part = where_forms
    g = _by_line(part)
    chain = g[25].spec["params"]["chain"]   # a + b: two selects, the second on its operand
    assert chain[0] == {"op": "select", "cond": [], "cmp": "gt", "value": 0.0, "then": [],
                        "else": [{"op": "scale", "value": 0.2}]}
    assert chain[1]["op"] == "add" and chain[1]["pre"][0]["cmp"] == "gt"   # 0.5 < |y| is |y| > 0.5
    assert chain[1]["pre"][0]["cond"] == [{"op": "abs"}] and chain[1]["pre"][0]["else"] == 1.0
    assert g[17].spec["params"]["chain"] == [{"op": "masked_fill", "value": 0.0}, {"op": "scale", "value": 2.0}]
    assert g[20].spec["params"]["chain"] == [{"op": "masked_keep", "value": -1.0}, {"op": "relu"}]
    # the broadcast [1, S, S] mask is not expanded for the bmm's epilogue: the softmax after it
    # takes the masked_fill(-inf) as its prologue and reads the mask in place
    (sm,) = [grp for grp in part.groups if grp.family == "softmax"]
    assert sm.spec["params"]["prologue"] == [{"op": "masked_fill", "value": float("-inf"), "every": 1, "period": 36}]
    assert {"view": "periodic"}.items() <= sm.inputs[1].items()
    assert "epilogue" not in g[18].spec["params"]


def test_two_tensor_formulas_are_one_kernel(where_forms):
    _, _, part = where_forms
    g = _by_line(part)
    assert g[21].spec["params"]["chain"] == [{"op": "relu"}, {"op": "add", "pre": [{"op": "relu"}]}]
    assert [s["op"] for s in g[22].spec["params"]["chain"]] == ["sigmoid", "mul"]
    assert [s["op"] for s in g[23].spec["params"]["chain"]] == ["sub", "abs", "mul"]
    assert len(part.groups) == 8


def test_where_of_two_tensors_stays_pytorch_with_the_reason(where_forms):
    _, _, part = where_forms
    why = {t["op"]: t["why"] for t in part.torch_ops}
    assert "two tensors under a mask" in why["where (line 24)"]


def test_where_forms_model_new_matches(tmp_path, where_forms):
    source, cap, part = where_forms
    assert_model_new_matches(tmp_path, source, cap, part)


def test_torch_alias_spellings_fuse_like_the_usual_ones(tmp_path):
    """torch.multiply stayed PyTorch as "outside the kernel catalog" and split KernelBench L2 52
    (held-out half, planned on the CPU 2026-12-06) into three groups."""
    source = (MODULES / "torch_aliases.py").read_text()
    cap = capture(str(MODULES / "torch_aliases.py"))
    part = partition(cap)
    assert part.torch_ops == [] and len(part.groups) == 1
    ops = [s["op"] for s in part.groups[0].spec["params"]["epilogue"]]
    assert ops[:2] == ["bias", "mish"] and "mul" in ops and ops[-2:] == ["abs", "neg"]   # x * tanh(softplus(x))
    assert_model_new_matches(tmp_path, source, cap, part)


def test_control_flow_on_sizes_is_captured_for_the_calls_shapes(tmp_path):
    """An assert or an if on sizes and a loop over range(x.size(0)) stopped the trace ("control
    flow on a traced value"): held-out KernelBench L3 Swin V2 crashed the capture, and NetVLAD and
    a hand-written RNN were captured only in parts (2026-12-06)."""
    source = (MODULES / "shape_control_flow.py").read_text()
    cap = capture(str(MODULES / "shape_control_flow.py"))
    assert cap["problems"] == [] and len(cap["graphs"]) == 1, cap["problems"]
    targets = [n["target"] for n in cap["graphs"][0]["nodes"]]
    assert targets.count("torch.tanh") == 3   # the loop, unrolled for seq's length 3
    assert_model_new_matches(tmp_path, source, cap, partition(cap))


def _capture_problems(tmp_path, module: str, old: str, new: str) -> list[str]:
    """The capture's problems with `module` edited (old -> new)."""
    path = tmp_path / f"edited_{module}"
    path.write_text((MODULES / module).read_text().replace(old, new))
    return [p["reason"] for p in capture(str(path))["problems"]]


def test_control_flow_on_values_is_still_refused(tmp_path):
    reasons = _capture_problems(tmp_path, "shape_control_flow.py", "if x.size(-1) != 8:", "if x.sum() > 0:")
    assert any("control flow on a traced value" in r for r in reasons), reasons


def test_tensor_constants_in_forward_are_captured_and_fused(tmp_path):
    """torch.tensor(c) inside forward made capture give up on Model.forward ("builds a tensor
    constant"): KernelBench L2 31 came back as a lone conv group, its tail left in PyTorch."""
    source = (MODULES / "tensor_constants.py").read_text()
    cap = capture(str(MODULES / "tensor_constants.py"))
    assert cap["problems"] == [], cap["problems"]
    part = partition(cap)
    assert len(part.groups) == 1 and part.groups[0].family == "conv"
    steps = part.groups[0].spec["params"]["epilogue"]
    assert {"op": "clamp_max", "value": 0.5} in steps and {"op": "clamp_min", "value": -0.25} in steps
    assert {"op": "shift", "value": -1.5} in steps
    assert {t["why"].split(":")[0] for t in part.torch_ops} <= {"a constant made from Python numbers"}
    assert_model_new_matches(tmp_path, source, cap, part, changed={"bias": torch.randn(8, 1, 1)})


def test_a_large_tensor_constant_in_forward_is_still_refused(tmp_path):
    reasons = _capture_problems(tmp_path, "tensor_constants.py", "torch.tensor(-0.25)",
                                "torch.tensor([float(i) for i in range(100)])[:1]")
    assert any("tensor constant" in r for r in reasons), reasons


def test_views_are_free_and_im2col_is_not(tmp_path):
    """ViT's patches (x.unfold(2, p, p).unfold(3, p, p)) were "outside the kernel catalog", so a
    configured LLM was asked to write a kernel for a view; F.unfold (im2col) computes and stays so."""
    from test_module_conv import captured_source
    source = ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
              "class Model(nn.Module):\n    def forward(self, x):\n"
              "        p = x.unfold(2, 4, 4).unfold(3, 4, 4).narrow(1, 0, 2).movedim(1, -1)\n"
              "        return p.reshape(2, -1) * 2.0, F.unfold(x, 2)\n\n\n"
              "def get_inputs():\n    return [torch.rand(2, 3, 8, 8)]\n\n\n"
              "def get_init_inputs():\n    return []\n")
    _, part = captured_source(tmp_path, source)
    assert [t["op"].split(" ")[0] for t in part.torch_ops] == ["unfold"], part.torch_ops
