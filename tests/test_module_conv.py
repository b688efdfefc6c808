"""Convolutions in uploaded modules: which nodes become conv groups, what their epilogues take,
why some stay PyTorch, and that ModelNew with the conv kernels computes what Model does (in the
interpreter, Model's state_dict loaded).  tests/modules/conv_block.py and conv_bias_act.py also
run through optimize end to end in tests/test_module_optimize.py."""
from __future__ import annotations

from pathlib import Path

import torch

from mtmc.module.assemble import assemble
from mtmc.module.capture import capture
from mtmc.module.fusion import partition
from mtmc.tools.loader import load_file
from kernel_helpers import template_kernels

MODULES = Path(__file__).parent / "modules"


def captured_source(tmp_path, source: str, name: str = "model.py"):
    path = tmp_path / name
    path.write_text(source)
    cap = capture(str(path))
    return cap, partition(cap)


def assert_model_new_matches(tmp_path, source: str, cap, part) -> None:
    """ModelNew with every group's template kernel at its default config: Model's outputs."""
    out = tmp_path / "new_model.py"
    out.write_text(assemble(source, cap, part.groups, template_kernels(part.groups)))
    m = load_file(out, f"conv_new_{abs(hash(source))}")
    torch.manual_seed(0)
    model, new = m.Model(*m.get_init_inputs()), m.ModelNew(*m.get_init_inputs())
    new.load_state_dict(model.state_dict())
    inputs = m.get_inputs()
    with torch.no_grad():
        torch.testing.assert_close(new(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)


def test_conv_block_groups():
    part = partition(capture(str(MODULES / "conv_block.py")))
    conv, depthwise, up = part.groups
    assert [g.spec["op"] for g in part.groups] == ["conv2d", "conv2d", "conv_transpose2d"]
    # bias, the [C, 1, 1] scale as a channel vector, relu; the weights are module parameters
    assert conv.spec["params"]["epilogue"] == [{"op": "bias"}, {"op": "mul", "channel": True}, {"op": "relu"}]
    assert conv.args[1:3] == [{"attr": "conv.weight"}, {"attr": "conv.bias"}]
    # F.conv2d(padding="same", groups=self.mid_ch): a depthwise conv with its padding worked out
    assert depthwise.spec["params"]["groups"] == 8 and depthwise.spec["params"]["padding"] == [[1, 1], [1, 1]]
    # the transposed conv adds the skip tensor (a full operand) and applies tanh
    assert up.spec["params"]["output_padding"] == [1, 1] and up.spec["dims"]["OH"] == 10
    assert up.spec["params"]["epilogue"] == [{"op": "add"}, {"op": "tanh"}]
    assert up.inputs[2] == {"arg": 2, "view": "like", "of": "out"} and part.torch_ops == []


LEFT_TO_PYTORCH = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.reflect = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
        self.conv = nn.Conv1d(4, 6, 3)

    def forward(self, x, seq):
        y = self.reflect(x)
        z = F.conv2d(y, self.reflect.weight, groups=y.shape[1] // 4)   # groups computed from a size
        return z.sum(), self.conv(seq[0])                                # an unbatched conv1d


def get_inputs():
    return [torch.randn(2, 4, 6, 6), torch.randn(2, 4, 9)]


def get_init_inputs():
    return []
"""


def test_what_the_conv_kernels_do_not_serve_stays_pytorch_with_the_reason(tmp_path):
    _, part = captured_source(tmp_path, LEFT_TO_PYTORCH)
    # the reflect-padded conv is served now (its gather remaps indices); the other two are not
    assert [g.spec["params"].get("padding_mode") for g in part.groups if g.family == "conv"] == ["reflect"]
    why = {t["node"]: t["why"] for t in part.torch_ops}
    assert "computed number of groups" in why["conv2d"]
    assert "unbatched" in why["conv"]


TAILS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv3d(2, 4, (2, 3, 1), stride=(1, 2, 1), padding=(1, 0, 0), bias=False)
        self.b = nn.ConvTranspose1d(4, 4, 3, stride=2, groups=2)
        self.mask = nn.Parameter(torch.rand(1, 1, 5, 1, 5))

    def forward(self, x, s):
        y = self.a(x) * self.mask            # broadcast over all but channels: expanded, noted
        y = y - 0.25
        t = self.b(s)                        # two users: the conv alone, its users are their own ops
        return torch.sigmoid(y), t + t.mean()


def get_inputs():
    return [torch.randn(2, 2, 4, 6, 5), torch.randn(1, 4, 7)]


def get_init_inputs():
    return []
"""


def test_conv_tails_and_model_new_matches(tmp_path):
    cap, part = captured_source(tmp_path, TAILS)
    a, b = [g for g in part.groups if g.family == "conv"]
    assert a.spec["op"] == "conv3d" and [s["op"] for s in a.spec["params"]["epilogue"]] == ["mul", "shift", "sigmoid"]
    assert a.inputs[2]["view"] == "like" and any("expanded" in n for n in a.notes)
    assert b.spec["op"] == "conv_transpose1d" and b.spec["params"]["epilogue"] == [{"op": "bias"}]
    assert_model_new_matches(tmp_path, TAILS, cap, part)
